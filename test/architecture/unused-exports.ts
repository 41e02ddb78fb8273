/**
 * Exports nobody imports. TypeScript's own checker resolves every identifier of every file of the
 * program (src/, test/, bench/) to its symbol, through each import alias to the declaration; an
 * export of a file under the checked folder that no other file reaches that way is unused. Named
 * imports, namespace imports (`ns.x`), re-exports, `import()` (`(await import(p)).x`,
 * `const { x } = await import(p)`, a pattern over `Promise.all` of them) and import types all reach it.
 * Not seen: a name imported by a script in a string (tests that spawn `node -e`); such names are
 * imported elsewhere too.
 */
import path from 'node:path';
import ts from 'typescript';

export interface UnusedExport {
  /** The declaring file, relative to the root. */
  file: string;
  name: string;
  /** 1-based line of its declaration. */
  line: number;
  /** Whether its own file uses it (then the export alone goes; else the declaration too). */
  usedInFile: boolean;
}

/** The program of a tsconfig, e.g. tsconfig.test.json (src/, test/ and bench/). */
export function programOf(tsconfig: string): ts.Program {
  const read = ts.readConfigFile(tsconfig, (f) => ts.sys.readFile(f));
  if (read.error) throw new Error(ts.flattenDiagnosticMessageText(read.error.messageText, '\n'));
  const parsed = ts.parseJsonConfigFileContent(read.config, ts.sys, path.dirname(tsconfig));
  return ts.createProgram({ rootNames: parsed.fileNames, options: { ...parsed.options, noEmit: true } });
}

/** Each symbol and its aliases' targets, with the files that name it. */
function usesOf(program: ts.Program, checker: ts.TypeChecker): Map<ts.Symbol, Set<string>> {
  const uses = new Map<ts.Symbol, Set<string>>();
  const mark = (first: ts.Symbol | undefined, file: string): void => {
    // Through every alias: an import names the exporting file's symbol, a re-export the next one.
    for (let s = first, hops = 0; s !== undefined && hops < 16; hops++) {
      let files = uses.get(s);
      if (files === undefined) uses.set(s, (files = new Set()));
      files.add(file);
      s = s.flags & ts.SymbolFlags.Alias ? checker.getImmediateAliasedSymbol(s) : undefined;
    }
  };
  for (const sf of program.getSourceFiles()) {
    if (sf.isDeclarationFile || sf.fileName.includes('/node_modules/')) continue;
    const visit = (node: ts.Node): void => {
      if (ts.isIdentifier(node)) mark(checker.getSymbolAtLocation(node), sf.fileName);
      else if (ts.isObjectBindingPattern(node)) {
        // `const [{ x }] = await Promise.all([import(p)])`: x names the export through the pattern's type.
        const type = checker.getTypeAtLocation(node);
        for (const el of node.elements) {
          const key = el.propertyName ?? el.name;
          if (ts.isIdentifier(key)) mark(type.getProperty(key.text), sf.fileName);
        }
      }
      if (isImportCall(node)) {
        // `const { x } = await import(p)` and `(await import(p)).x` name the export through the
        // namespace object's type, whose members may be copies: found by name in the module instead.
        const mod = checker.getSymbolAtLocation(node.arguments[0]!);
        for (const name of namesTakenFrom(node)) if (mod !== undefined) mark(checker.tryGetMemberInModuleExports(name, mod), sf.fileName);
      }
      ts.forEachChild(node, visit);
    };
    visit(sf);
  }
  return uses;
}

function isImportCall(node: ts.Node): node is ts.CallExpression {
  return ts.isCallExpression(node) && node.expression.kind === ts.SyntaxKind.ImportKeyword && node.arguments.length > 0;
}

/** The names read from an `import()`'s namespace: destructured from it, or a property of it. */
function namesTakenFrom(call: ts.CallExpression): string[] {
  let n: ts.Node = call;
  while (ts.isAwaitExpression(n.parent) || ts.isParenthesizedExpression(n.parent)) n = n.parent;
  const p = n.parent;
  if (ts.isVariableDeclaration(p) && ts.isObjectBindingPattern(p.name))
    return p.name.elements.map((el) => el.propertyName ?? el.name).flatMap((k) => (ts.isIdentifier(k) ? [k.text] : []));
  if (ts.isPropertyAccessExpression(p)) return [p.name.text];
  return [];
}

/** The unused exports of the files under `dir` (absolute), sorted by file and line. */
export function unusedExports(program: ts.Program, dir: string, root: string): UnusedExport[] {
  const checker = program.getTypeChecker();
  const uses = usesOf(program, checker);
  const out: UnusedExport[] = [];
  for (const sf of program.getSourceFiles()) {
    if (sf.isDeclarationFile || !sf.fileName.startsWith(dir + path.sep)) continue;
    const mod = checker.getSymbolAtLocation(sf);
    if (mod === undefined) continue;
    for (const sym of checker.getExportsOfModule(mod)) {
      const decl = sym.declarations?.find((d) => d.getSourceFile() === sf);
      if (decl === undefined) continue; // `export *` of another file: counted there
      const files = uses.get(sym) ?? new Set<string>();
      if ([...files].some((f) => f !== sf.fileName)) continue;
      out.push({
        file: path.relative(root, sf.fileName),
        name: sym.name,
        line: sf.getLineAndCharacterOfPosition(decl.getStart()).line + 1,
        usedInFile: selfUsed(sf, sym, checker),
      });
    }
  }
  return out.sort((a, b) => a.file.localeCompare(b.file) || a.line - b.line);
}

/** Whether `sym` is named in its file other than where it is declared or exported. */
function selfUsed(sf: ts.SourceFile, sym: ts.Symbol, checker: ts.TypeChecker): boolean {
  let used = false;
  const visit = (node: ts.Node): void => {
    if (used) return;
    if (ts.isIdentifier(node) && node.text === sym.name) {
      const p = node.parent;
      const naming = (p as { name?: ts.Node }).name === node && (ts.isDeclarationStatement(p) || ts.isVariableDeclaration(p));
      if (!naming && !ts.isExportSpecifier(p)) {
        const s = checker.getSymbolAtLocation(node);
        if (s === sym || (s !== undefined && s.flags & ts.SymbolFlags.Alias && checker.getAliasedSymbol(s) === sym)) used = true;
      }
    }
    ts.forEachChild(node, visit);
  };
  visit(sf);
  return used;
}
