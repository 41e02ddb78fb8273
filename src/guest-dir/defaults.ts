/** Where the guest directories are by default (--guest-dir), in a module of its own: the CLI reads it without loading the writer. */
export const DEFAULT_GUEST_DIR = '/run/vmsr-helper/guests';
