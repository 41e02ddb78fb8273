/**
 * What a document names in backquotes, checked against the tree: paths exist, file names resolve,
 * and a code name is declared, in the file it is named with when there is one. Pure reading: the
 * TypeScript parser, no checker.
 */
import fs from 'node:fs';
import path from 'node:path';
import ts from 'typescript';

/**
 * Backquoted words that are not names in this code: system calls, kernel, systemd and wire
 * vocabulary, which the docs name as the world spells them.
 */
export const NOT_CODE: ReadonlySet<string> = new Set([
  // system calls and kernel names
  'fstat',
  'mmap',
  'pread',
  'recvmsg',
  'sendmsg',
  'CAP_SYS_RAWIO',
  'SCM_RIGHTS',
  'energy_uj',
  // systemd's environment
  'LISTEN_FDS',
  'LISTEN_FDNAMES',
  // the v2 protocol's words (docs/protocol-v2.md)
  'VMS2',
  'READ',
  'UPDATE',
]);

/** A backquoted span and what surrounds it, with the block (paragraph, list item, table row) it is in. */
interface Quoted {
  text: string;
  block: number;
  /** The characters after the closing backquote, and before the opening one, on its line. */
  after: string;
  before: string;
  line: number;
}

/** Every backquoted span outside fenced code, grouped by block. */
function quotedSpans(markdown: string): Quoted[] {
  const out: Quoted[] = [];
  let block = 0;
  let fenced = false;
  markdown.split('\n').forEach((text, i) => {
    if (text.startsWith('```')) {
      fenced = !fenced;
      block++;
      return;
    }
    if (fenced) return;
    // A blank line, a table row and a list item each start a block; a wrapped line continues one.
    if (text.trim() === '' || text.startsWith('|') || /^\s*(\d+\.|-)\s/.test(text) || text.startsWith('#')) block++;
    for (const m of text.matchAll(/`([^`]+)`/g))
      out.push({ text: m[1]!, block, before: text.slice(0, m.index), after: text.slice(m.index + m[0].length), line: i + 1 });
  });
  return out;
}

/** The tree's files, relative to the root, under the given folders. */
function filesUnder(root: string, dirs: readonly string[]): string[] {
  const out: string[] = [];
  const walk = (rel: string) => {
    for (const e of fs.readdirSync(path.join(root, rel), { withFileTypes: true })) {
      const p = path.posix.join(rel, e.name);
      if (e.isDirectory()) walk(p);
      else out.push(p);
    }
  };
  for (const d of dirs) if (fs.existsSync(path.join(root, d))) walk(d);
  return out;
}

/** The names a TypeScript file declares: functions, classes, types, variables, members, enum members. */
export function declaredNames(file: string): Set<string> {
  const sf = ts.createSourceFile(file, fs.readFileSync(file, 'utf8'), ts.ScriptTarget.Latest, true);
  const names = new Set<string>();
  const visit = (node: ts.Node): void => {
    const name = (node as { name?: ts.Node }).name;
    const declares =
      ts.isFunctionDeclaration(node) ||
      ts.isClassDeclaration(node) ||
      ts.isInterfaceDeclaration(node) ||
      ts.isTypeAliasDeclaration(node) ||
      ts.isEnumDeclaration(node) ||
      ts.isEnumMember(node) ||
      ts.isVariableDeclaration(node) ||
      ts.isBindingElement(node) ||
      ts.isMethodDeclaration(node) ||
      ts.isMethodSignature(node) ||
      ts.isPropertyDeclaration(node) ||
      ts.isPropertySignature(node) ||
      ts.isPropertyAssignment(node) ||
      ts.isShorthandPropertyAssignment(node) ||
      ts.isGetAccessorDeclaration(node) ||
      ts.isParameterPropertyDeclaration(node, node.parent);
    if (declares && name !== undefined && (ts.isIdentifier(name) || ts.isStringLiteral(name))) names.add(name.text);
    ts.forEachChild(node, visit);
  };
  visit(sf);
  return names;
}

const ROOT_FOLDERS = ['src', 'test', 'bench', 'contrib', 'docs', 'scripts'];
const IDENTIFIER = /^[A-Za-z_$][\w$]*(\.[A-Za-z_$][\w$]*)*(\(\))?$/;
const FILE_NAME = /^[\w.-][\w./-]*\.(ts|js|md|json|sh)$/;

/**
 * What `markdown` names that the tree under `root` does not have, one line each: a path
 * (`src/...`, `test/...`, ...) that does not exist, a file name (`x.ts`) that no file under the
 * block's src/ folders ends with (`v2/x.ts`: or anywhere in src/), a folder (`x/`) that none has, and a code name declared
 * neither in the file it is named with (`file` (`name`), `name` (`file`), `name` in `file`) nor,
 * when it is named alone, anywhere in src/.
 */
export function missingNames(markdown: string, root: string): string[] {
  const files = filesUnder(root, ROOT_FOLDERS);
  const declared = new Map<string, Set<string>>();
  const declaredIn = (file: string) => {
    let d = declared.get(file);
    if (d === undefined) declared.set(file, (d = declaredNames(path.join(root, file))));
    return d;
  };
  const srcTs = files.filter((f) => f.startsWith('src/') && f.endsWith('.ts'));
  const spans = quotedSpans(markdown);
  // The src/ layer folders a block names: its file names are looked up under them.
  const contexts = new Map<number, string[]>();
  for (const q of spans) {
    const m = /^src\/([\w-]+)\//.exec(q.text);
    if (m) contexts.set(q.block, [...(contexts.get(q.block) ?? []), `src/${m[1]}/`]);
  }
  /** The files a file name in a block can mean (all when the name is a path). */
  const resolve = (name: string, block: number): string[] => {
    if (ROOT_FOLDERS.some((d) => name.startsWith(`${d}/`)) || !name.includes('/')) {
      if (fs.existsSync(path.join(root, name)) && !name.endsWith('/')) return [name];
    }
    const named = (under: readonly string[]) => files.filter((f) => under.some((u) => f.startsWith(u)) && f.endsWith(`/${name}`));
    if (name.endsWith('.md')) return named(['docs/']);
    // Under the block's folders; a name with a folder of its own (`lifecycle/config.ts`) anywhere in src/ too.
    const near = named(contexts.get(block) ?? ['src/']);
    return near.length > 0 || !name.includes('/') ? near : named(['src/']);
  };
  const problems: string[] = [];
  spans.forEach((q, i) => {
    const where = `line ${q.line}: \`${q.text}\``;
    const text = q.text;
    if (ROOT_FOLDERS.some((d) => text === `${d}/` || text.startsWith(`${d}/`))) {
      if (!fs.existsSync(path.join(root, text))) problems.push(`${where} does not exist`);
      return;
    }
    if (FILE_NAME.test(text)) {
      if (resolve(text, q.block).length === 0) problems.push(`${where}: no such file`);
      return;
    }
    if (/^[\w-]+(\/[\w-]+)*\/$/.test(text)) {
      const under = contexts.get(q.block) ?? ['src/'];
      if (!files.some((f) => under.some((u) => f.startsWith(u)) && f.includes(`/${text}`))) problems.push(`${where}: no such folder`);
      return;
    }
    if (!IDENTIFIER.test(text) || NOT_CODE.has(text)) return;
    const [first, ...members] = text.replace(/\(\)$/, '').split('.');
    if (fs.existsSync(path.join(root, 'src', first!)) && members.length === 0) return; // a folder's name (`ratio`)
    const named = namedWith(spans, i);
    const candidates = named !== undefined ? resolve(named, q.block).filter((f) => f.endsWith('.ts')) : srcTs;
    const holders = candidates.filter((f) => declaredIn(f).has(first!));
    if (holders.length === 0) {
      problems.push(`${where} is declared ${named !== undefined ? `neither in \`${named}\`` : 'nowhere in src/'}`);
      return;
    }
    for (const m of members)
      if (!holders.some((f) => declaredIn(f).has(m)))
        problems.push(`${where}: ${m} is not declared where ${first} is (${holders.join(', ')})`);
  });
  return problems;
}

/**
 * The file a code name is named with: `file` (`name` ...), `name` (`file` ...), `a` and `name`
 * (`file`), `name`/`b` ... (`file`), or `name` in `file`. Undefined when it stands alone.
 */
function namedWith(spans: readonly Quoted[], i: number): string | undefined {
  const q = spans[i]!;
  const isFile = (s: Quoted | undefined) => s !== undefined && s.block === q.block && s.line === q.line && FILE_NAME.test(s.text);
  // `file` (`name`: the span before, with only " (" between.
  const prev = spans[i - 1];
  if (isFile(prev) && q.before.endsWith(`\`${prev!.text}\` (`)) return prev!.text;
  // `name` (`file`, `name` in `file`, or a list of names (", ", " and ", "/") before one of those.
  for (let j = i + 1; j < spans.length; j++) {
    const s = spans[j]!;
    if (s.line !== q.line) return undefined;
    const p = spans[j - 1]!;
    const between = s.before.slice(p.before.length + p.text.length + 2);
    if (isFile(s)) return between === ' (' || between === ' in ' ? s.text : undefined;
    if (!(between === ', ' || between === ' and ' || between === '/') || !IDENTIFIER.test(s.text)) return undefined;
  }
  return undefined;
}
