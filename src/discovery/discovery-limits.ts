/** Discovery's bound, alone: the CLI shows it without loading the scanner (docs/daemon.md "Where the time goes"). */

/** VM processes discovery tracks at once, by default (the exporter exports that many, plus registrations). */
export const DEFAULT_MAX_DISCOVERED_VMS = 4096;
