/**
 * The folder graph of src/: every relative import of every src/**\/*.ts file, reduced to the first
 * folder under src/ on each side. Imports are read by TypeScript's own pre-processor, so comments and
 * strings that merely look like imports do not count, and dynamic import() does.
 */
import fs from 'node:fs';
import path from 'node:path';
import ts from 'typescript';

/**
 * The layers, lowest first: a folder may import only folders of a lower rank (docs: docs/design.md "Layout").
 * protocol and trace share a rank and so may not import each other.
 */
export const LAYER_RANK: Readonly<Record<string, number>> = {
  common: 0,
  model: 1,
  ratio: 2,
  'guest-energy': 2,
  protocol: 3,
  trace: 3,
  os: 4,
  logging: 4,
  msr: 5,
  state: 5,
  budget: 5,
  energy: 6,
  sampling: 7,
  client: 8,
  discovery: 9,
  'guest-dir': 8,
  keeper: 9,
  'power-limit': 9,
  helper: 10,
  exporter: 11,
  cli: 12,
  bin: 13,
};

export interface ImportEdge {
  /** Importing file and imported specifier, relative to the repo root. */
  file: string;
  specifier: string;
  /** First folder under src/ of each side ('' for a file directly in src/); `to` is null for a package or node: module. */
  from: string;
  to: string | null;
  /** The imported .ts file relative to the repo root (null for a package or node: module). */
  target?: string | null;
}

function tsFiles(dir: string): string[] {
  const out: string[] = [];
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...tsFiles(p));
    else if (e.name.endsWith('.ts') && !e.name.endsWith('.d.ts')) out.push(p);
  }
  return out.sort();
}

function folderOf(srcDir: string, file: string): string {
  const rel = path.relative(srcDir, file).split(path.sep);
  return rel.length > 1 ? rel[0]! : '';
}

/** Every import of every .ts file under srcDir. */
export function importEdges(srcDir: string, root = path.dirname(srcDir)): ImportEdge[] {
  const edges: ImportEdge[] = [];
  for (const file of tsFiles(srcDir)) {
    const info = ts.preProcessFile(fs.readFileSync(file, 'utf8'), true, true);
    for (const imp of info.importedFiles) {
      const specifier = imp.fileName;
      const from = folderOf(srcDir, file);
      let to: string | null = null;
      let targetFile: string | null = null;
      if (specifier.startsWith('.')) {
        const target = path.resolve(path.dirname(file), specifier);
        const rel = path.relative(srcDir, target);
        // An import leaving src/ (e.g. ../package.json) is named by its path, so it never matches a folder.
        to = rel.startsWith('..') ? path.relative(root, target) : folderOf(srcDir, target);
        targetFile = path.relative(root, target.replace(/\.js$/, '.ts'));
      }
      edges.push({ file: path.relative(root, file), specifier, from, to, target: targetFile });
    }
  }
  return edges;
}

/** Folder -> folder -> the files (with specifier) behind that edge. */
export function folderGraph(edges: readonly ImportEdge[]): Map<string, Map<string, string[]>> {
  const g = new Map<string, Map<string, string[]>>();
  for (const e of edges) {
    if (!g.has(e.from)) g.set(e.from, new Map());
    if (e.to === null || e.to === e.from) continue;
    const out = g.get(e.from)!;
    const files = out.get(e.to) ?? [];
    files.push(`${e.file} imports '${e.specifier}'`);
    out.set(e.to, files);
  }
  return g;
}

/** Strongly connected groups of more than one folder (Tarjan): each is a cycle of folders. */
export function folderCycles(g: ReadonlyMap<string, ReadonlyMap<string, string[]>>): string[][] {
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const groups: string[][] = [];
  let next = 0;
  const nodes = new Set<string>([...g.keys(), ...[...g.values()].flatMap((m) => [...m.keys()])]);
  const visit = (v: string): void => {
    index.set(v, next);
    low.set(v, next++);
    stack.push(v);
    onStack.add(v);
    for (const w of g.get(v)?.keys() ?? []) {
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
    }
    if (low.get(v) === index.get(v)) {
      const group: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        onStack.delete(w);
        group.push(w);
      } while (w !== v);
      if (group.length > 1) groups.push(group.sort());
    }
  };
  for (const v of [...nodes].sort()) if (!index.has(v)) visit(v);
  return groups;
}

/** A readable account of a cycle: each edge inside the group with the files that make it. */
export function describeCycle(g: ReadonlyMap<string, ReadonlyMap<string, string[]>>, group: readonly string[]): string {
  const lines = [`folders ${group.join(', ')} import each other:`];
  for (const a of group) {
    for (const [b, files] of g.get(a) ?? []) {
      if (!group.includes(b)) continue;
      lines.push(`  ${a} -> ${b}:`, ...files.map((f) => `    ${f}`));
    }
  }
  return lines.join('\n');
}

/** Imports that go up or sideways in LAYER_RANK, and folders the layering does not know. */
export function layerViolations(edges: readonly ImportEdge[], rank: Readonly<Record<string, number>> = LAYER_RANK): string[] {
  const out: string[] = [];
  const unknown = new Set<string>();
  for (const e of edges) {
    if (rank[e.from] === undefined) unknown.add(e.from);
    if (e.to === null || e.to === e.from) continue;
    const rf = rank[e.from];
    const rt = rank[e.to];
    if (rt === undefined) {
      unknown.add(e.to);
      continue;
    }
    if (rf !== undefined && rt >= rf)
      out.push(`${e.file} imports '${e.specifier}': src/${e.from} (layer ${rf}) may import only lower layers, src/${e.to} is layer ${rt}`);
  }
  for (const f of [...unknown].sort())
    out.push(`src/${f || '.'} is not a layer: place it in LAYER_RANK (test/architecture/import-graph.ts) and the layout of docs/design.md`);
  return out;
}

/**
 * The parts of src/helper/ (each subfolder, and each file at its top level), lowest first, ranked like
 * the folders of src/: a part may import only parts of a lower rank, so no two import each other.
 */
export const HELPER_RANK: Readonly<Record<string, number>> = {
  'helper/handover': 0,
  'helper/legacy': 1,
  'helper/guest': 2,
  'helper/server': 2,
  'helper/v2': 3,
  'helper/assemble.ts': 4,
  'helper/lifecycle': 5,
  'helper/daemon.ts': 6,
};

function helperPart(file: string): string | null {
  const rel = path.posix.relative('src/helper', file.split(path.sep).join('/'));
  return rel.startsWith('..') ? null : `helper/${rel.split('/')[0]}`;
}

/**
 * The imports between two parts of src/helper/, with `from` and `to` the parts (as HELPER_RANK names
 * them), so layerViolations and folderGraph rank them.
 */
export function helperPartEdges(edges: readonly ImportEdge[]): ImportEdge[] {
  const out: ImportEdge[] = [];
  for (const e of edges) {
    const from = helperPart(e.file);
    const to = e.target ? helperPart(e.target) : null;
    if (from === null || to === null || from === to) continue;
    out.push({ ...e, from, to });
  }
  return out;
}

/**
 * The pure folders and what each may import: no node: module, no package, only these folders. The ratio
 * core and the shared shapes do no I/O, so they run (and are tested) without the world.
 */
export const PURE_FOLDERS: Readonly<Record<string, readonly string[]>> = {
  common: ['common'],
  ratio: ['model', 'ratio', 'common'],
  'guest-energy': ['guest-energy', 'ratio', 'common'],
  model: ['model', 'common'],
};

/** Imports by a pure folder of anything it may not import (no fs, net, processes, packages). */
export function impureCoreImports(
  edges: readonly ImportEdge[],
  pure: Readonly<Record<string, readonly string[]>> = PURE_FOLDERS,
): string[] {
  return edges
    .filter((e) => pure[e.from] !== undefined && (e.to === null || !pure[e.from]!.includes(e.to)))
    .map((e) => `${e.file} imports '${e.specifier}', outside ${pure[e.from]!.map((f) => `src/${f}`).join(', ')}`);
}

/** File -> the files it imports (type-only imports included: a type cycle is a cycle in the design). */
export function fileGraph(edges: readonly ImportEdge[]): Map<string, Map<string, string[]>> {
  const g = new Map<string, Map<string, string[]>>();
  for (const e of edges) {
    if (!g.has(e.file)) g.set(e.file, new Map());
    if (e.target === null || e.target === undefined) continue;
    const out = g.get(e.file)!;
    out.set(e.target, [...(out.get(e.target) ?? []), `${e.file} imports '${e.specifier}'`]);
  }
  return g;
}
