/**
 * The one grammar of the messages a user reads: "cannot <do what>: <why>; <fix>". The fix is left out
 * only when there is nothing the user can do.
 */
export function cannot(what: string, why: string, fix?: string): string {
  return fix === undefined || fix === '' ? `cannot ${what}: ${why}` : `cannot ${what}: ${why}; ${fix}`;
}

/** An Error whose message follows the grammar of cannot(). */
export function cannotError(what: string, why: string, fix?: string): Error {
  return new Error(cannot(what, why, fix));
}
