/**
 * The folders of src/ form a one-way graph (docs/design.md "Layout"): no folder imports one that imports it
 * back, each imports only lower layers, and the ratio core imports nothing outside itself. The checks
 * run on the real tree and, so that they are known to be able to fail, on small made-up graphs.
 */
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import {
  describeCycle,
  fileGraph,
  folderCycles,
  folderGraph,
  HELPER_RANK,
  helperPartEdges,
  importEdges,
  impureCoreImports,
  layerViolations,
  type ImportEdge,
} from './import-graph.js';

const SRC = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../src');
const edges = importEdges(SRC);

const edge = (from: string, to: string | null, specifier = `../${to}/x.js`): ImportEdge => ({
  file: `src/${from}/a.ts`,
  specifier,
  from,
  to,
});

describe('src/ folder layering', () => {
  it('reads the imports of the sources (the graph is not empty)', () => {
    expect(edges.some((e) => e.from === 'helper' && e.to === 'msr')).toBe(true);
    expect(edges.some((e) => e.from === 'ratio' && e.to === 'ratio')).toBe(true);
  });

  it('has no folder cycle: no folder imports a folder that imports it back', () => {
    const g = folderGraph(edges);
    expect(folderCycles(g).map((c) => describeCycle(g, c))).toEqual([]);
  });

  it('has every import go to a lower layer, and every folder in a layer', () => {
    expect(layerViolations(edges)).toEqual([]);
  });

  it('keeps src/ratio and src/common pure: they import only src/ratio and src/common (no node: I/O modules, no packages)', () => {
    expect(impureCoreImports(edges)).toEqual([]);
  });

  it('has no file cycle, inside a folder or across, type-only imports included', () => {
    const g = fileGraph(edges);
    expect(folderCycles(g).map((c) => describeCycle(g, c))).toEqual([]);
  });
});

describe('src/helper/ part layering', () => {
  const parts = helperPartEdges(edges);

  it('reads the imports between the parts of src/helper/ (the graph is not empty)', () => {
    expect(parts.some((e) => e.from === 'helper/daemon.ts' && e.to === 'helper/lifecycle')).toBe(true);
  });

  it('has no two parts of src/helper/ that import each other (but the pairs fixed on the continuity branch)', () => {
    const g = folderGraph(parts);
    expect(folderCycles(g).map((c) => describeCycle(g, c))).toEqual([]);
  });

  it('has every import between parts of src/helper/ go to a lower rank, and every part ranked', () => {
    expect(layerViolations(parts, HELPER_RANK)).toEqual([]);
  });
});

describe('the layering checks', () => {
  it('folderCycles finds a two-folder cycle and names the files that make it', () => {
    const g = folderGraph([edge('msr', 'ratio'), edge('ratio', 'msr'), edge('helper', 'msr')]);
    const cycles = folderCycles(g);
    expect(cycles).toEqual([['msr', 'ratio']]);
    const text = describeCycle(g, cycles[0]!);
    expect(text).toContain("ratio -> msr:\n    src/ratio/a.ts imports '../msr/x.js'");
    expect(text).toContain("msr -> ratio:\n    src/msr/a.ts imports '../ratio/x.js'");
  });

  it('folderCycles finds a longer cycle and nothing in an acyclic graph', () => {
    expect(folderCycles(folderGraph([edge('a', 'b'), edge('b', 'c'), edge('c', 'a'), edge('d', 'a')]))).toEqual([['a', 'b', 'c']]);
    expect(folderCycles(folderGraph([edge('cli', 'helper'), edge('helper', 'msr'), edge('cli', 'msr')]))).toEqual([]);
  });

  it('layerViolations refuses an upward import, a sideways one, and an unknown folder', () => {
    expect(layerViolations([edge('msr', 'helper')])).toEqual([expect.stringContaining("src/msr/a.ts imports '../helper/x.js'")]);
    expect(layerViolations([edge('trace', 'protocol')])).toHaveLength(1);
    expect(layerViolations([edge('helper', 'msr')])).toEqual([]);
    expect(layerViolations([edge('gadgets', 'ratio')])).toEqual([expect.stringContaining('src/gadgets is not a layer')]);
  });

  it('impureCoreImports refuses node:fs, a package and another folder from src/ratio, and src/ratio from src/common', () => {
    const bad = [edge('ratio', null, 'node:fs'), edge('ratio', null, 'pino'), edge('ratio', 'msr'), edge('common', 'ratio')];
    expect(impureCoreImports([...bad, edge('ratio', 'ratio', './types.js'), edge('ratio', 'common')])).toHaveLength(4);
  });

  it('helperPartEdges names helper/ parts, leaves out imports inside one part or outside helper/', () => {
    const e = (file: string, target: string): ImportEdge => ({ file, specifier: 'x', from: 'helper', to: 'helper', target });
    const all = [
      e('src/helper/server/server.ts', 'src/helper/legacy/legacy-session.ts'),
      e('src/helper/legacy/legacy-session.ts', 'src/helper/server/incomplete-frames.ts'),
      e('src/helper/server/server.ts', 'src/helper/server/listener.ts'),
      e('src/helper/daemon.ts', 'src/os/libc.ts'),
    ];
    const parts = helperPartEdges(all);
    expect(parts.map((p) => [p.from, p.to])).toEqual([
      ['helper/server', 'helper/legacy'],
      ['helper/legacy', 'helper/server'],
    ]);
    expect(folderCycles(folderGraph(parts))).toEqual([['helper/legacy', 'helper/server']]);
    expect(layerViolations(parts, HELPER_RANK)).toEqual([
      expect.stringContaining('src/helper/legacy (layer 1) may import only lower layers'),
    ]);
  });

  it('fileGraph with folderCycles finds two files of one folder that import each other', () => {
    const a = { file: 'src/helper/a.ts', specifier: './b.js', from: 'helper', to: 'helper', target: 'src/helper/b.ts' };
    const b = { file: 'src/helper/b.ts', specifier: './a.js', from: 'helper', to: 'helper', target: 'src/helper/a.ts' };
    const c = { file: 'src/helper/c.ts', specifier: './a.js', from: 'helper', to: 'helper', target: 'src/helper/a.ts' };
    const g = fileGraph([a, b, c]);
    expect(folderCycles(g)).toEqual([['src/helper/a.ts', 'src/helper/b.ts']]);
    expect(folderCycles(fileGraph([a, c]))).toEqual([]);
  });
});
