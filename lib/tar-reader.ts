// Finding one file in a tar archive held in memory: enough of ustar, GNU long names and PAX `path` records to read
// the layer of a Wasm image (Istio's "compat" layout puts the module at `plugin.wasm`). Nothing is written to disk,
// so an entry's name is only compared, never used as a path.

const BLOCK = 512;

export interface TarEntry {
  name: string;
  data: Buffer;
}

/** The first regular file whose base name is `baseName`, or undefined. Throws on a malformed archive. */
export function findTarFile(archive: Buffer, baseName: string): TarEntry | undefined {
  let offset = 0;
  let longName: string | undefined;
  while (offset + BLOCK <= archive.length) {
    const header = archive.subarray(offset, offset + BLOCK);
    if (header.every((b) => b === 0)) return undefined; // end-of-archive marker
    if (!checksumOk(header)) throw new Error(`tar header at offset ${offset} has a bad checksum`);
    const size = readSize(header, offset);
    const type = String.fromCharCode(header[156]);
    const dataStart = offset + BLOCK;
    const dataEnd = dataStart + size;
    if (dataEnd > archive.length) throw new Error(`tar entry at offset ${offset} runs past the end of the archive`);
    const data = archive.subarray(dataStart, dataEnd);
    offset = dataStart + Math.ceil(size / BLOCK) * BLOCK;
    if (type === 'L') {
      longName = cString(data);
      continue;
    }
    if (type === 'x') {
      longName = paxPath(data) ?? longName;
      continue;
    }
    if (type === 'g') continue;
    const name = longName ?? headerName(header);
    longName = undefined;
    if ((type === '0' || type === '\0') && baseOf(name) === baseName) return { name, data };
  }
  return undefined;
}

function headerName(h: Buffer): string {
  const name = cString(h.subarray(0, 100));
  const ustar = h.subarray(257, 262).toString('latin1') === 'ustar';
  const prefix = ustar ? cString(h.subarray(345, 500)) : '';
  return prefix ? `${prefix}/${name}` : name;
}

function baseOf(name: string): string {
  const trimmed = name.replace(/\/+$/, '');
  return trimmed.slice(trimmed.lastIndexOf('/') + 1);
}

function cString(b: Buffer): string {
  const end = b.indexOf(0);
  return b.subarray(0, end < 0 ? b.length : end).toString('utf8');
}

function readSize(h: Buffer, offset: number): number {
  const field = h.subarray(124, 136);
  let size: number;
  if (field[0] & 0x80) {
    // GNU base-256: big-endian binary after the marker bit.
    size = 0;
    for (let i = 1; i < field.length; i++) size = size * 256 + field[i];
  } else {
    const text = cString(field).trim();
    if (!/^[0-7]*$/.test(text)) throw new Error(`tar header at offset ${offset} has a bad size field`);
    size = text ? parseInt(text, 8) : 0;
  }
  if (!Number.isSafeInteger(size)) throw new Error(`tar header at offset ${offset} has a bad size field`);
  return size;
}

function checksumOk(h: Buffer): boolean {
  const text = cString(h.subarray(148, 156)).trim();
  if (!/^[0-7]+$/.test(text)) return false;
  let sum = 0;
  for (let i = 0; i < BLOCK; i++) sum += i >= 148 && i < 156 ? 0x20 : h[i];
  return sum === parseInt(text, 8);
}

/** The `path` record of a PAX extended header ("<len> path=<value>\n" records). */
function paxPath(data: Buffer): string | undefined {
  let pos = 0;
  let found: string | undefined;
  while (pos < data.length) {
    const space = data.indexOf(0x20, pos);
    if (space < 0) break;
    const len = parseInt(data.subarray(pos, space).toString('latin1'), 10);
    if (!Number.isSafeInteger(len) || len <= 0 || pos + len > data.length) break;
    const record = data.subarray(space + 1, pos + len - 1).toString('utf8');
    if (record.startsWith('path=')) found = record.slice(5);
    pos += len;
  }
  return found;
}
