// A hostile SDS client with no dependencies, run as another uid (setpriv) against an SDS socket: opens one
// StreamSecrets call per name given, asks for that name, and prints every response message it gets within the
// wait as `name<TAB>base64` lines (raw DiscoveryResponse bytes for the test to decode). gRPC framing by hand.
'use strict';
const http2 = require('node:http2');
const net = require('node:net');

const [socket, waitMs, ...names] = process.argv.slice(2);
const TYPE = 'type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret';

function field(no, text) {
  const b = Buffer.from(text);
  const len = [];
  let n = b.length;
  do {
    len.push((n & 0x7f) | (n > 0x7f ? 0x80 : 0));
    n >>>= 7;
  } while (n);
  return Buffer.concat([Buffer.from([(no << 3) | 2, ...len]), b]);
}

const session = http2.connect('http://localhost', { createConnection: () => net.connect(socket) });
session.on('error', (e) => process.stderr.write(`session error: ${e.message}\n`));
for (const name of names) {
  const req = session.request({ ':method': 'POST', ':path': '/envoy.service.secret.v3.SecretDiscoveryService/StreamSecrets', 'content-type': 'application/grpc', te: 'trailers' });
  req.on('error', () => undefined);
  const msg = Buffer.concat([field(3, name), field(4, TYPE)]);
  const head = Buffer.alloc(5);
  head.writeUInt32BE(msg.length, 1);
  req.write(Buffer.concat([head, msg]));
  let buf = Buffer.alloc(0);
  req.on('data', (c) => {
    buf = Buffer.concat([buf, c]);
    while (buf.length >= 5 && buf.length >= 5 + buf.readUInt32BE(1)) {
      const n = buf.readUInt32BE(1);
      process.stdout.write(`${name}\t${buf.subarray(5, 5 + n).toString('base64')}\n`);
      buf = buf.subarray(5 + n);
    }
  });
}
setTimeout(() => {
  session.destroy();
  process.exit(0);
}, Number(waitMs)).unref();
setTimeout(() => undefined, Number(waitMs) + 1000);
