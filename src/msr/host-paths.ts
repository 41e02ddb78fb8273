/** Where the helper looks for the host: configurable so tests and unusual hosts can point elsewhere. */
export interface HostPaths {
  /** printf-style template with one %u for the CPU number. */
  msrPathTemplate: string;
  procRoot: string;
  sysRoot: string;
}

export const DEFAULT_HOST_PATHS: HostPaths = {
  msrPathTemplate: '/dev/cpu/%u/msr',
  procRoot: '/proc',
  sysRoot: '/sys',
};

export function msrPath(template: string, cpu: number): string {
  return template.replace('%u', String(cpu));
}

export function validateMsrPathTemplate(template: string): string {
  const count = template.split('%u').length - 1;
  if (count !== 1) throw new Error(`MSR path template must contain exactly one %u for the CPU number: ${JSON.stringify(template)}`);
  return template;
}
