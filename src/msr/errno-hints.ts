/** THE errno -> why and fix map of the MSR devices (/dev/cpu/N/msr), for the daemon's startup checks and `record`. */
/** What to do on a host without RAPL registers, or to look around first: the one wording of it. */
export const TRY_WITHOUT_RAPL =
  "to try vmsr-helper without RAPL: --energy-source synthetic (energy made up from CPU load, not a measurement) or 'vmsr-helper demo'";

interface ErrnoHint {
  why: string;
  fix: string;
}

const NO_DEVICE: ErrnoHint = {
  why: 'the MSR device does not exist',
  fix: "load the msr driver with 'modprobe msr' (or point --msr-path at the devices)",
};

const MSR_HINTS: Readonly<Record<string, ErrnoHint>> = {
  ENOENT: NO_DEVICE,
  // The msr driver answers ENXIO for a CPU that is offline or absent, ENODEV when it is not bound.
  ENXIO: NO_DEVICE,
  ENODEV: NO_DEVICE,
  EACCES: { why: 'permission denied', fix: 'run as root or with CAP_SYS_RAWIO' },
  EPERM: { why: 'permission denied', fix: 'run as root or with CAP_SYS_RAWIO' },
  EIO: {
    why: 'the CPU does not implement this register (no RAPL here?)',
    fix: `run on a host whose CPU has RAPL; or, ${TRY_WITHOUT_RAPL}`,
  },
};

/** The hint for an errno code from opening or reading an MSR device; undefined for codes without one. */
export function msrErrnoHint(code: string | undefined): ErrnoHint | undefined {
  return code === undefined ? undefined : MSR_HINTS[code];
}
