/** A JSON value handed across an exec or to a child in the environment: read once and removed, so nothing later sees it. */

/** `env[name]` parsed (and removed): undefined when unset, null when it is not JSON or `valid` refuses it. */
export function takeEnvJson<T>(name: string, valid: (v: Partial<T>) => boolean, env: NodeJS.ProcessEnv): T | null | undefined {
  const text = env[name];
  delete env[name];
  if (text === undefined) return undefined;
  try {
    const v = JSON.parse(text) as Partial<T> | null;
    return v !== null && typeof v === 'object' && valid(v) ? (v as T) : null;
  } catch {
    return null;
  }
}
