/**
 * Discovery's bound, in a module of its own: the command line shows it without loading the scanner,
 * which the daemon loads once it serves QEMU (docs/daemon.md "Where the time goes").
 */

/** VM processes discovery tracks at once, by default (the exporter exports that many, plus registrations). */
export const DEFAULT_MAX_DISCOVERED_VMS = 4096;
