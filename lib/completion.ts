// `pilot-agent completion bash|zsh`: a shell completion script, as the Go agent's cobra `completion` command
// prints one. Static and minimal: the first word completes to a command, later words to that command's flags
// (cobra's scripts ask the binary at each TAB; these need no agent running and cannot drift from a flag table the
// test compares with each command's --help). Pure: values in, text out.

export type Shell = 'bash' | 'zsh';
export const SHELLS: readonly Shell[] = ['bash', 'zsh'];

/** Command name -> its flags (with the leading dashes). */
export type CompletionTable = Readonly<Record<string, readonly string[]>>;

// Names and flags are the agent's own (letters, digits, - and _), so they need no quoting in a shell word list.
function words(list: readonly string[]): string {
  for (const w of list) {
    if (!/^[-\w]+$/.test(w)) throw new Error(`completion: ${JSON.stringify(w)} is not a plain word`);
  }
  return list.join(' ');
}

export function completionScript(shell: Shell, program: string, table: CompletionTable): string {
  const fn = `_${program.replace(/\W/g, '_')}`;
  const commands = words(Object.keys(table));
  if (shell === 'bash') {
    const cases = Object.entries(table)
      .map(([cmd, flags]) => `    ${cmd}) list="${words(flags)}" ;;`)
      .join('\n');
    return `# bash completion for ${program}; load with: source <(${program} completion bash)
${fn}() {
  local cur=\${COMP_WORDS[COMP_CWORD]} cmd="" list i
  for ((i = 1; i < COMP_CWORD; i++)); do
    case \${COMP_WORDS[i]} in -*) ;; *) cmd=\${COMP_WORDS[i]}; break ;; esac
  done
  case $cmd in
    "") list="${commands}" ;;
${cases}
    *) list="" ;;
  esac
  COMPREPLY=($(compgen -W "$list" -- "$cur"))
}
complete -o default -F ${fn} ${program}
`;
  }
  const cases = Object.entries(table)
    .map(([cmd, flags]) => `    ${cmd}) compadd -- ${words(flags)} ;;`)
    .join('\n');
  return `#compdef ${program}
# zsh completion for ${program}; load with: source <(${program} completion zsh), or save as _${program} in $fpath
${fn}() {
  if (( CURRENT == 2 )); then
    compadd -- ${commands}
    return
  fi
  case \${words[2]} in
${cases}
  esac
}
if [ "$funcstack[1]" = "${fn}" ]; then ${fn} "$@"; else compdef ${fn} ${program}; fi
`;
}
