/**
 * The one shape of "a value or a failure", for checks that refuse input without throwing (wire
 * payloads, registrations, the vCPU rule): `{ ok: true, value }` or `{ ok: false, error }`. The failure
 * carries whatever the caller needs to answer: a message, or a code and a message.
 */
export type Result<T, E = string> = { readonly ok: true; readonly value: T } | { readonly ok: false; readonly error: E };

export function ok<T>(value: T): { readonly ok: true; readonly value: T } {
  return { ok: true, value };
}

export function fail<E>(error: E): { readonly ok: false; readonly error: E } {
  return { ok: false, error };
}
