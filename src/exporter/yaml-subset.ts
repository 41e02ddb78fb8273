/**
 * The part of YAML a web configuration file uses, parsed strictly: block mappings and sequences
 * by indentation (spaces), plain, 'single' and "double" quoted scalars, one-line flow sequences of
 * scalars ([a, "b"]), the empty {} and [], literal block scalars (| and |-, for inline PEM text),
 * comments, and one leading ---. Anything else (anchors, aliases, tags, folded scalars, multi-line
 * plain scalars, a mapping inside a sequence, duplicate keys, tabs in indentation) is refused with
 * its line number: a file is read as the user meant it or not at all. Values come back as
 * null-prototype objects, arrays, strings, numbers, booleans and null.
 *
 * Node has no YAML parser; this file is the one place that reads YAML, behind parseYamlSubset().
 */
import { cannot } from '../common/errors.js';

export type YamlValue = string | number | boolean | null | YamlValue[] | { [key: string]: YamlValue };

interface Line {
  no: number;
  indent: number;
  /** The text after the indentation, comment and trailing blanks removed. */
  text: string;
  /** The whole line as written (for block scalars, where # is text). */
  raw: string;
}

class YamlError extends Error {}

function fail(no: number, why: string, fix = 'write it as plain YAML (see docs/exporter.md "Web configuration file")'): never {
  throw new YamlError(`line ${no}: ${why}; ${fix}`);
}

/** Cuts a comment: # at the start or after a blank, outside quotes. */
function stripComment(s: string): string {
  let quote: string | null = null;
  for (let i = 0; i < s.length; i++) {
    const c = s[i]!;
    if (quote !== null) {
      if (c === '\\' && quote === '"') i++;
      else if (c === quote) quote = null;
    } else if (c === '"' || c === "'") {
      // A quote opens a quoted scalar only at a value's start; inside a plain scalar it is text.
      if (i === 0 || /[\s[,:-]/.test(s[i - 1]!)) quote = c;
    } else if (c === '#' && (i === 0 || s[i - 1] === ' ' || s[i - 1] === '\t')) return s.slice(0, i);
  }
  return s;
}

function splitLines(text: string): Line[] {
  const out: Line[] = [];
  const raws = text.split(/\r?\n/);
  for (let i = 0; i < raws.length; i++) {
    const raw = raws[i]!;
    const m = /^( *)(.*)$/.exec(raw)!;
    const rest = m[2]!;
    const text = stripComment(rest).trimEnd();
    if (text === '') {
      out.push({ no: i + 1, indent: -1, text: '', raw });
      continue;
    }
    if (rest.startsWith('\t')) fail(i + 1, 'a tab in the indentation', 'indent with spaces');
    out.push({ no: i + 1, indent: m[1]!.length, text, raw });
  }
  return out;
}

const ESCAPES: Record<string, string> = { '\\': '\\', '"': '"', '/': '/', n: '\n', t: '\t', r: '\r', '0': '\0', ' ': ' ' };

/** A quoted scalar at the start of `s`; returns its value and the length it took. */
function quoted(s: string, no: number): [string, number] {
  const q = s[0]!;
  let out = '';
  for (let i = 1; i < s.length; i++) {
    const c = s[i]!;
    if (q === "'") {
      if (c === "'") {
        if (s[i + 1] === "'") {
          out += "'";
          i++;
          continue;
        }
        return [out, i + 1];
      }
      out += c;
      continue;
    }
    if (c === '"') return [out, i + 1];
    if (c !== '\\') {
      out += c;
      continue;
    }
    const e = s[++i];
    if (e === 'u' && /^[0-9A-Fa-f]{4}$/.test(s.slice(i + 1, i + 5))) {
      out += String.fromCharCode(parseInt(s.slice(i + 1, i + 5), 16));
      i += 4;
    } else if (e !== undefined && ESCAPES[e] !== undefined) out += ESCAPES[e];
    else fail(no, `unknown escape \\${e ?? ''} in a double-quoted string`, 'use \\\\, \\", \\n, \\t or \\uXXXX');
  }
  return fail(no, `a ${q === '"' ? 'double' : 'single'}-quoted string does not end on its line`, `close it with ${q} on the same line`);
}

/** A plain scalar's value: null, a boolean, an integer, or the text. */
function plain(s: string, no: number): YamlValue {
  if (/^[&*!|>%@`?]/.test(s))
    fail(no, `${JSON.stringify(s[0])} starts an anchor, alias, tag or block this reader does not take`, 'quote the value');
  if (/:\s/.test(s) || s.endsWith(':')) fail(no, `${JSON.stringify(s)}: a colon and a blank inside a plain value`, 'quote the value');
  if (/^(?:~|null|Null|NULL)$/.test(s)) return null;
  if (/^(?:true|True|TRUE)$/.test(s)) return true;
  if (/^(?:false|False|FALSE)$/.test(s)) return false;
  if (/^[-+]?\d{1,15}$/.test(s)) return Number(s);
  return s;
}

/** A value written on one line: quoted, a flow sequence of scalars, {} or [], or plain. */
function inlineValue(s: string, no: number): YamlValue {
  if (s === '{}') return Object.create(null) as Record<string, YamlValue>;
  if (s.startsWith('{')) fail(no, 'a flow mapping ({...})', 'write the mapping as indented key: value lines');
  if (s.startsWith('[')) {
    if (!s.endsWith(']')) fail(no, 'a flow sequence that does not end with ] on its line', 'write it on one line or as "- item" lines');
    const body = s.slice(1, -1).trim();
    const items: YamlValue[] = [];
    let i = 0;
    while (i < body.length) {
      let item: YamlValue;
      if (body[i] === '"' || body[i] === "'") {
        const [v, len] = quoted(body.slice(i), no);
        item = v;
        i += len;
      } else {
        const end = body.indexOf(',', i);
        const text = (end < 0 ? body.slice(i) : body.slice(i, end)).trim();
        if (text === '' || /^[[{]/.test(text)) fail(no, 'an empty or nested item in a flow sequence', 'list plain values: [a, b]');
        item = plain(text, no);
        i = end < 0 ? body.length : end;
      }
      items.push(item);
      while (body[i] === ' ') i++;
      if (i < body.length) {
        if (body[i] !== ',') fail(no, `${JSON.stringify(body.slice(i))} after an item of a flow sequence`, 'separate items with ,');
        i++;
        while (body[i] === ' ') i++;
        if (i >= body.length) fail(no, 'a trailing , in a flow sequence', 'remove it');
      }
    }
    return items;
  }
  if (s.startsWith('"') || s.startsWith("'")) {
    const [v, len] = quoted(s, no);
    if (s.slice(len).trim() !== '') fail(no, `${JSON.stringify(s.slice(len).trim())} after a quoted string`, 'put one value per key');
    return v;
  }
  return plain(s, no);
}

class Parser {
  private i = 0;
  constructor(private readonly lines: Line[]) {}

  /** The next line that holds something, or null; skips blank lines. */
  private peek(): Line | null {
    while (this.i < this.lines.length && this.lines[this.i]!.indent < 0) this.i++;
    return this.lines[this.i] ?? null;
  }

  document(): YamlValue {
    const first = this.peek();
    if (first === null) return null;
    if (first.text === '---' && first.indent === 0) {
      this.i++;
      if (this.peek() === null) return null;
    }
    const top = this.peek()!;
    if (top.indent !== 0) fail(top.no, 'the first entry is indented', 'start top-level keys at column 1');
    const v = this.block(0);
    const left = this.peek();
    if (left !== null)
      fail(
        left.no,
        left.text === '---' || left.text === '...' ? 'a second document' : 'unexpected indentation',
        'keep one document, aligned',
      );
    return v;
  }

  private block(indent: number): YamlValue {
    const l = this.peek()!;
    return isItem(l.text) ? this.sequence(indent) : this.mapping(indent);
  }

  private mapping(indent: number): YamlValue {
    const out = Object.create(null) as Record<string, YamlValue>;
    for (let l = this.peek(); l !== null && l.indent === indent && !isItem(l.text); l = this.peek()) {
      if (l.text === '---' || l.text === '...') fail(l.no, 'a second document', 'keep one document');
      const [key, rest] = splitKey(l);
      if (Object.prototype.hasOwnProperty.call(out, key)) fail(l.no, `the key ${JSON.stringify(key)} appears twice`, 'keep one');
      this.i++;
      out[key] = this.valueAfter(rest, l, indent, true);
    }
    this.checkDedent(indent);
    return out;
  }

  private sequence(indent: number): YamlValue {
    const out: YamlValue[] = [];
    for (let l = this.peek(); l !== null && l.indent === indent && isItem(l.text); l = this.peek()) {
      const rest = l.text.slice(1).trim();
      if (/^(?:"[^"]*"|'[^']*'|[^'"\s[{][^:]*?):(?:\s|$)/.test(rest))
        fail(l.no, 'a mapping inside a sequence', 'this file format has no list of mappings: check the key');
      this.i++;
      out.push(this.valueAfter(rest, l, indent, false));
    }
    this.checkDedent(indent);
    return out;
  }

  /** A line below a block at `indent` that is indented more but belongs to nothing. */
  private checkDedent(indent: number): void {
    const l = this.peek();
    if (l !== null && l.indent > indent) fail(l.no, 'unexpected indentation', 'align it with the keys of its block');
  }

  /** The value of a key or item whose rest of line is `rest`: inline, a nested block, or a literal block scalar. */
  private valueAfter(rest: string, l: Line, indent: number, inMapping: boolean): YamlValue {
    if (rest === '|' || rest === '|-') return this.literal(indent, rest === '|', l.no);
    if (rest !== '') return inlineValue(rest, l.no);
    const next = this.peek();
    if (next === null || next.indent < indent) return null;
    if (next.indent > indent) return this.block(next.indent);
    // A sequence may sit at its key's own indentation ("key:\n- a").
    if (inMapping && isItem(next.text)) return this.sequence(indent);
    return null;
  }

  /** A literal block scalar: the following lines indented more than `indent`, as written. */
  private literal(indent: number, keepNewline: boolean, no: number): string {
    const body: string[] = [];
    let blockIndent = -1;
    while (this.i < this.lines.length) {
      const l = this.lines[this.i]!;
      const lead = /^ */.exec(l.raw)![0].length;
      if (l.raw.trim() === '') {
        body.push('');
        this.i++;
        continue;
      }
      if (lead <= indent) break;
      if (blockIndent < 0) blockIndent = lead;
      if (lead < blockIndent) fail(l.no, 'a line of a block scalar is indented less than its first line', 'indent the block evenly');
      body.push(l.raw.slice(blockIndent));
      this.i++;
    }
    if (blockIndent < 0) fail(no, 'an empty block scalar', 'write the text on the lines below, indented');
    while (body.length > 0 && body[body.length - 1] === '') body.pop();
    return body.join('\n') + (keepNewline ? '\n' : '');
  }
}

function isItem(text: string): boolean {
  return text === '-' || text.startsWith('- ');
}

/** A mapping line's key and what follows its colon. */
function splitKey(l: Line): [string, string] {
  const t = l.text;
  if (t.startsWith('"') || t.startsWith("'")) {
    const [key, len] = quoted(t, l.no);
    const after = t.slice(len);
    if (!/^:(?:\s|$)/.test(after)) fail(l.no, 'a quoted key without a colon after it', 'write "key": value');
    return [key, after.slice(1).trim()];
  }
  const m = /^([^:]*?):(?:\s+(.*))?$/.exec(t);
  if (m === null) fail(l.no, `${JSON.stringify(t)} is not "key: value"`, 'write key: value, or - item in a list');
  const key = m[1]!;
  if (key === '' || /^[&*!|>%@`?{[]/.test(key))
    fail(l.no, `${JSON.stringify(key)} is not a key this reader takes`, 'use a plain or quoted key');
  return [key, (m[2] ?? '').trim()];
}

/** Parses `text`; throws "cannot read SOURCE: line N: why; fix" on anything outside the subset. */
export function parseYamlSubset(text: string, source: string): YamlValue {
  try {
    return new Parser(splitLines(text)).document();
  } catch (e) {
    if (e instanceof YamlError) throw new Error(cannot(`read ${source}`, e.message));
    throw e;
  }
}
