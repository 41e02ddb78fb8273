/** THE start-up steps that open what the daemon holds, in order, each adopting its part of the Inherited (as root: before the re-exec). */
import fs from 'node:fs';
import { MsrDevice } from '../../msr/device.js';
import type { HostCpu, Vendor } from '../../model/host.js';
import type { Logger } from '../../logging/logger.js';
import { openListener, removeOwnSocketFile, type Listener } from '../server/listener.js';
import { acquirePidfile, pidfileOf, type Pidfile } from './pidfile.js';
import { checkPermission, checkTopology, openMsrDevices } from './startup-checks.js';
import { readVendor } from '../../msr/vendor.js';
import type { DaemonConfig } from './config.js';
import type { Inherited, InheritedFrom } from '../handover/inherited.js';
import { cannotError } from '../../common/errors.js';
import { chooseEnergySource } from '../../energy/choose.js';
import type { EnergySourceKind } from '../../energy/kinds.js';
import { POWERCAP_FIX } from '../../energy/powercap-source.js';
import { scanPowercap } from '../../energy/powercap-zones.js';

/** The start-up's steps, in their order (drop, serve and ready are the daemon's, after these). */
type StartStep = 'checks' | 'msr' | 'listen' | 'pidfile' | 'files' | 'drop';

/** What became of a step: run here, adopted from the Inherited, or not asked for (no pidfile without -f/-d). */
export interface StepDone {
  step: StartStep;
  done: 'ran' | 'adopted' | 'not asked';
}

export function stepDone(steps: StepDone[], step: StartStep, done: StepDone['done'], how: InheritedFrom, log?: Logger): void {
  steps.push({ step, done });
  log?.debug({ step, done, how }, `start-up step ${step}: ${done}`);
}

export interface Opened {
  how: InheritedFrom;
  vendor: Vendor;
  cpus: HostCpu[];
  /** The energy source chosen by the checks (--energy-source, auto resolved), and why. */
  energy: EnergySourceKind;
  energyWhy: string;
  /** The MSR fds (none unless energy is msr); closed by whoever holds the Opened. */
  device: MsrDevice;
  /** [energy_uj path, fd] of every powercap zone (energy powercap); the energy source owns them once built. */
  powercap: ReadonlyMap<string, number>;
  listener: Listener;
  pidfile?: Pidfile;
  /** [path, fd] of the files created for the v2 service (--record), or adopted. */
  files: ReadonlyMap<string, number>;
  steps: StepDone[];
  /** What an exec passes on: every part, by fd number. */
  handover(how: InheritedFrom): Inherited;
  /** Undoes everything, for a start that does not go on (a failed exec); a daemon that went on closes its parts itself. */
  close(log?: Pick<Logger, 'warn'>): Promise<void>;
}

/** Runs the steps not given by `inh` (`files`: --record's, created as root); a failure undoes them and throws the step's error. */
export async function openStart(
  config: DaemonConfig,
  inh: Inherited,
  o: { files?: readonly string[]; log?: Logger } = {},
): Promise<Opened> {
  const steps: StepDone[] = [];
  const did = (step: StartStep, done: StepDone['done']) => stepDone(steps, step, done, inh.how, o.log);
  const device = new MsrDevice(config.hostPaths.msrPathTemplate);
  const files = new Map(inh.files ?? []);
  const powercap = new Map(inh.powercap ?? []);
  const created: number[] = [];
  let listener: Listener | undefined;
  let pidfile: Pidfile | undefined;
  const close = async (log?: Pick<Logger, 'warn'>) => {
    for (const fd of created.splice(0)) fs.closeSync(fd);
    for (const fd of powercap.values()) fs.closeSync(fd);
    powercap.clear();
    pidfile?.release();
    await listener?.close(log);
    device.close();
  };
  try {
    const checked = runChecks(config, inh);
    did('checks', inh.checks ? 'adopted' : 'ran');
    const { vendor, cpus, energy, energyWhy } = checked;
    // Every online cpu's MSR device, or every powercap zone's energy_uj (root-only since CVE-2020-8694).
    did('msr', openEnergyFiles(config, inh, checked, device, powercap));
    listener = await listenStep(config, inh, o.log);
    did('listen', inh.listener ? 'adopted' : 'ran');
    if (inh.pidfile !== undefined) {
      pidfile = pidfileOf(inh.pidfile);
      did('pidfile', 'adopted');
    } else if (config.daemonize || config.pidfileGiven) {
      pidfile = acquirePidfile(config.pidfile);
      did('pidfile', 'ran');
    } else {
      did('pidfile', 'not asked');
    }
    // Created while the helper may still create them anywhere.
    did('files', createFiles(o.files ?? [], inh, files, created));
    const bound = listener;
    const handover = (how: InheritedFrom): Inherited => ({
      how,
      checks: { vendor, cpus, energy, energyWhy },
      msr: device.openFds(),
      ...(powercap.size > 0 ? { powercap: [...powercap] } : {}),
      listener: { fd: bound.fd, ...(bound.file ? { file: bound.file } : {}) },
      ...(pidfile ? { pidfile: pidfile.path } : {}),
      ...(files.size ? { files: [...files] } : {}),
      ...(inh.named ? { named: inh.named } : {}),
    });
    return { how: inh.how, ...checked, device, powercap, listener, ...(pidfile ? { pidfile } : {}), files, steps, handover, close };
  } catch (e) {
    await close(o.log);
    throw e;
  }
}

type Checked = Pick<Opened, 'vendor' | 'cpus' | 'energy' | 'energyWhy'>;

function runChecks(config: DaemonConfig, inh: Inherited): Checked {
  if (inh.checks) {
    const { vendor, cpus } = inh.checks;
    return { vendor, cpus, energy: inh.checks.energy ?? 'msr', energyWhy: inh.checks.energyWhy ?? 'adopted' };
  }
  const paths = config.hostPaths;
  const vendor = config.vendor === 'auto' ? readVendor(paths.procRoot) : config.vendor;
  const cpus = checkTopology(paths.sysRoot);
  const chosen = chooseEnergySource(config.energySource, { msrPathTemplate: paths.msrPathTemplate, sysRoot: paths.sysRoot, cpus, vendor });
  if (chosen.kind === 'msr') checkPermission(paths.msrPathTemplate);
  return { vendor, cpus, energy: chosen.kind, energyWhy: chosen.why };
}

function openEnergyFiles(
  config: DaemonConfig,
  inh: Inherited,
  c: Checked,
  device: MsrDevice,
  powercap: Map<string, number>,
): StepDone['done'] {
  if (inh.msr || inh.powercap) {
    for (const [cpu, fd] of inh.msr ?? []) device.adopt(cpu, fd);
    return 'adopted';
  }
  if (c.energy === 'msr') {
    openMsrDevices(device, c.cpus);
    return 'ran';
  }
  if (c.energy === 'powercap') {
    openPowercapZones(powercap, config.hostPaths.sysRoot, c.vendor);
    return 'ran';
  }
  return 'not asked';
}

async function listenStep(config: DaemonConfig, inh: Inherited, log: Logger | undefined): Promise<Listener> {
  const l = inh.listener;
  try {
    return await openListener(l ? { fd: l.fd } : { path: config.socketPath }, {
      mode: config.socketMode,
      ...(config.socketGid !== undefined ? { gid: config.socketGid } : {}),
      ...(l?.file ? { file: l.file } : {}),
    });
  } catch (e) {
    // The socket file bound before the exec is ours even when its fd could not be adopted.
    if (l?.file) removeOwnSocketFile(l.file, log);
    throw e;
  }
}

/** Creates each of `asked` not inherited into `files` (path -> fd), noting the fds it made in `created`. */
function createFiles(asked: readonly string[], inh: Inherited, files: Map<string, number>, created: number[]): StepDone['done'] {
  for (const f of asked) {
    if (files.has(f)) continue;
    try {
      const fd = fs.openSync(f, 'w', 0o644);
      created.push(fd);
      files.set(f, fd);
    } catch (e) {
      throw cannotError(`create ${f}`, (e as NodeJS.ErrnoException).code ?? (e as Error).message, 'check the path');
    }
  }
  const inherited = new Set((inh.files ?? []).map(([p]) => p));
  return asked.length === 0 ? 'not asked' : asked.every((f) => inherited.has(f)) ? 'adopted' : 'ran';
}

function openPowercapZones(into: Map<string, number>, sysRoot: string, vendor: Vendor): void {
  for (const z of scanPowercap(sysRoot, vendor).zones) {
    try {
      into.set(z.energyPath, fs.openSync(z.energyPath, fs.constants.O_RDONLY));
    } catch (e) {
      throw cannotError(
        `open ${z.energyPath}`,
        (e as NodeJS.ErrnoException).code ?? (e as Error).message,
        `run as root (energy_uj is root-only), or ${POWERCAP_FIX}`,
      );
    }
  }
}
