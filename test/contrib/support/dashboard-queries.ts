/**
 * The PromQL of the Grafana dashboard, as Grafana would send it: every panel's targets (rows
 * included), its template variables' `label_values(...)` queries, and the substitution of the
 * variables and of Grafana's built-in intervals.
 */
import fs from 'node:fs';
import { DASHBOARD } from './contrib-files.js';

export interface DashboardTarget {
  panel: string;
  refId: string;
  expr: string;
  /** The labels its legend names (`{{label}}`). */
  legendLabels: string[];
}

interface Panel {
  title?: string;
  type?: string;
  panels?: Panel[];
  targets?: { refId?: string; expr?: string; legendFormat?: string }[];
  gridPos?: { h: number; w: number; x: number; y: number };
}

export interface TemplateVariable {
  name: string;
  type: string;
  query?: string | { query?: string };
  allValue?: string;
  includeAll?: boolean;
  multi?: boolean;
}

export interface Dashboard {
  schemaVersion: number;
  uid: string;
  title: string;
  panels: Panel[];
  templating: { list: TemplateVariable[] };
  annotations: { list: { name: string; expr?: string; enable?: boolean }[] };
}

export function loadDashboard(): Dashboard {
  return JSON.parse(fs.readFileSync(DASHBOARD, 'utf8')) as Dashboard;
}

/** Every panel, rows' inner panels included. */
export function allPanels(d: Dashboard): Panel[] {
  return d.panels.flatMap((p) => [p, ...(p.panels ?? [])]);
}

export function dashboardTargets(d: Dashboard): DashboardTarget[] {
  return allPanels(d).flatMap((p) =>
    (p.targets ?? []).map((t) => ({
      panel: p.title ?? '',
      refId: t.refId ?? '',
      expr: t.expr ?? '',
      legendLabels: [...(t.legendFormat ?? '').matchAll(/\{\{\s*(\w+)\s*\}\}/g)].map((m) => m[1]!),
    })),
  );
}

/** A query variable's `label_values(SELECTOR, LABEL)`, split. */
export function labelValuesQuery(v: TemplateVariable): { selector: string; label: string } {
  const q = typeof v.query === 'string' ? v.query : (v.query?.query ?? '');
  const m = /^label_values\((.+),\s*(\w+)\)$/.exec(q.trim());
  if (!m) throw new Error(`variable ${v.name}: ${q} is not label_values(SELECTOR, LABEL)`);
  return { selector: m[1]!, label: m[2]! };
}

/**
 * Grafana's built-in intervals for a Prometheus scraping every second: $__rate_interval is four
 * scrape intervals at least, $__interval the step of a short range, $__range the last minute.
 */
export const BUILTIN_INTERVALS: Record<string, string> = { __rate_interval: '4s', __interval: '1s', __range: '1m' };

/** `expr` with `$name` and `${name}` replaced from `values` (variables and built-ins); throws on a `$` left over. */
export function substitute(expr: string, values: Record<string, string>): string {
  const out = expr.replace(/\$\{(\w+)\}|\$(\w+)/g, (whole, a: string | undefined, b: string | undefined) => {
    const v = values[(a ?? b)!];
    if (v === undefined) throw new Error(`${expr}: no value for ${whole}`);
    return v;
  });
  return out;
}
