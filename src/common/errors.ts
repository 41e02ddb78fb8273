/** The one grammar of messages a user reads: "cannot <do what>: <why>; <fix>", the fix left out only when there is none. */
export function cannot(what: string, why: string, fix?: string): string {
  return fix === undefined || fix === '' ? `cannot ${what}: ${why}` : `cannot ${what}: ${why}; ${fix}`;
}

/** An Error whose message follows the grammar of cannot(). */
export function cannotError(what: string, why: string, fix?: string): Error {
  return new Error(cannot(what, why, fix));
}
