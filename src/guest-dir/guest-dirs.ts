/**
 * --guest-dir (docs/guest.md): each sample, for every VM whose DIR/<uuid>/ (or DIR/<name>/) exists, its powercap-shaped tree
 * (tree.ts) and statistics file, through SafeDir (which follows nothing); here: which VM a directory is, and when it is refused.
 */
import fs from 'node:fs';
import type { Logger } from 'pino';
import { cannot } from '../common/errors.js';
import { O_DIRECTORY, O_RDONLY, openAt } from '../os/libc/dir-fd.js';
import { errnoName } from '../os/libc/errno.js';
import { closeFd } from '../os/libc/fds.js';
import { LogLimiter } from '../logging/log-limiter.js';
import { EUID, SafeDir, settled, signature, WriteFailure, type GuestReaders } from './safe-dir.js';
import { ENERGY_UJ, POWERCAP_CLASS_DIR } from '../energy/powercap-zones.js';
import { GuestStatsFile, type StatsCopy } from './guest-stats-file.js';
import { DirWatch } from './dir-watch.js';
import { classLinkTarget, energyText, GUEST_STATS_FILE, guestDirName, zoneAttributes } from './tree.js';

/** Refusal lines per minute before they are counted instead (the VMs' own lines allow as many). */
const GUEST_LOG_BURST = 20;
/** Fds a directory asks of the budget (docs/guest.md): 15 for one virtual package with package, core, DRAM and PSYS. */
const GUEST_DIR_FDS = 16;
/** Samples between full checks, for what change checks miss (a hard link made elsewhere; a change within the time granularity). */
const GUEST_AUDIT_EVERY = 60;
const GUEST_AUDIT_EVERY_WATCHED = 600;

const rootOrHelper = (uid: number) => uid === 0 || uid === EUID;

export interface GuestDirVm {
  vmId: number;
  uuid: Uint8Array | null;
  name: string | null;
  pid: number;
  uid: number;
  live: boolean;
}

/** What the publisher reads of the daemon, each sample. */
export interface GuestDirSource {
  vms(): Iterable<GuestDirVm>;
  /** The VM's statistics written each sample into the memory `map` returns (given its bytes now); null for no such VM. */
  statsCopy(vmId: number, map: (bytes: Buffer) => ArrayBuffer): StatsCopy | null;
  /** Whether `n` more fds fit the daemon's budget (absent: always). */
  canOpen?(n: number, what: string): boolean;
  /** Whether the VM's process is in group `gid` (its gid or a supplementary group). */
  inGroup(vm: GuestDirVm, gid: number): boolean;
  /** Who besides root and the helper may read the tree of a VM run by `uid` (the statistics fd's rule). */
  readers(uid: number): GuestReaders;
}

/** A zone as written: the value it shows = base + (energy - start), base the count its file held. */
interface ZoneState {
  name: string;
  base: bigint;
  start: bigint;
  shown: bigint;
}

class Published {
  vmId = -1;
  readonly zones = new Map<string, ZoneState>();
  stats: GuestStatsFile | null = null;
  /** Written with the VM ended: nothing more changes. */
  final = false;
  /** Every zone shown, under its name, since the directory's last audit (false: check each one). */
  settled = false;
  samples = 0;
  watched = false;
  /** A write failed (a full file system): every zone is written again at the next sample. */
  failed = false;
  /** Whether a VM (by vmId) may have it: bound() asked once per VM. */
  readonly bound = new Map<number, boolean>();
  /** The uid its readers were set for (restrict), -1 before. */
  readersOf = -1;
  /** Why no VM naming it may have it, as last said ('' when one may). */
  unbound = '';

  constructor(readonly dir: SafeDir) {}
}

export class GuestDirs {
  private rootFd: number | null = null;
  private rootSig = '';
  private rootMissingSaid = false;
  private present = new Set<string>();
  private readonly published = new Map<string, Published>();
  /** Directories refused, by name: the signature they had, so they are checked again only once changed. */
  private readonly refused = new Map<string, string>();
  private readonly limiter: LogLimiter;
  /** Each VM's directory name, by its record (gone with it): 500 VMs cost 1.5 ms a sample uncached, 0.04 ms cached. */
  private readonly names = new WeakMap<GuestDirVm, { uuid: Uint8Array | null; name: string | null; dir: string | null }>();
  /** One inotify queue telling which published directories changed (null: each is fstat'ed per sample). */
  private watch: DirWatch | null | undefined;

  constructor(
    private readonly root: string,
    private readonly source: GuestDirSource,
    private readonly log: Logger,
  ) {
    this.limiter = new LogLimiter(log, GUEST_LOG_BURST);
  }

  /** One sample: every VM with a directory, written. Never throws: the sample's other work goes on. */
  sample(): void {
    try {
      if (!this.listRoot()) return;
      this.watchOpened()?.drain();
      const claims = this.claims();
      for (const name of this.published.keys()) if (!claims.has(name)) this.unpublish(name);
      for (const [name, vms] of claims) this.publish(name, vms);
    } catch (e) {
      this.limiter.warn('guest dir', { guestDir: this.root, err: (e as Error).message }, 'guest directories not written this sample');
    }
  }

  close(): void {
    for (const name of [...this.published.keys()]) this.unpublish(name);
    if (this.rootFd !== null) closeFd(this.rootFd);
    this.rootFd = null;
    this.watch?.close();
    this.watch = undefined;
    this.limiter.flush();
  }

  /** The inotify queue, made at the first sample with directories (one fd, from the daemon's budget); null without one. */
  private watchOpened(): DirWatch | null {
    if (this.watch !== undefined) return this.watch;
    const fits = this.source.canOpen?.(1, "the guest directories' inotify queue") ?? true;
    this.watch = fits ? DirWatch.open() : null;
    return this.watch;
  }

  /** DIR opened and its names listed when it changed; false when it is not there (nothing to do). */
  private listRoot(): boolean {
    if (this.rootFd === null) {
      const fd = openAt(-100, this.root, O_RDONLY | O_DIRECTORY);
      if (fd < 0) {
        // Said once: a host without guest directories (the default DIR absent) is not an error.
        if (!this.rootMissingSaid)
          this.log.info({ guestDir: this.root, err: errnoName(-fd) }, 'no guest directory: nothing is published into guests');
        this.rootMissingSaid = true;
        return false;
      }
      this.rootFd = fd;
      this.rootSig = '';
    }
    const st = fs.fstatSync(this.rootFd, { bigint: true });
    if (st.nlink === 0n) {
      // DIR itself was removed: let go of everything in it, and open DIR again at the next sample.
      for (const name of [...this.published.keys()]) this.unpublish(name);
      closeFd(this.rootFd);
      this.rootFd = null;
      return false;
    }
    const sig = signature(st);
    if (sig === this.rootSig) return this.present.size > 0;
    this.present = new Set(fs.readdirSync(`/proc/self/fd/${this.rootFd}`));
    this.rootSig = settled(st) ? sig : '';
    // A directory removed or replaced: let go of it (a new one is opened afresh).
    for (const name of this.published.keys()) if (!this.present.has(name)) this.unpublish(name);
    for (const name of this.refused.keys()) if (!this.present.has(name)) this.refused.delete(name);
    return this.present.size > 0;
  }

  /** Directory name -> the VMs that name it, for the names present in DIR. */
  private claims(): Map<string, GuestDirVm[]> {
    const out = new Map<string, GuestDirVm[]>();
    for (const vm of this.source.vms()) {
      const name = this.dirNameOf(vm);
      if (name === null || !this.present.has(name)) continue;
      const list = out.get(name);
      if (list) list.push(vm);
      else out.set(name, [vm]);
    }
    return out;
  }

  /** A VM's directory name, worked out once per UUID and name it has. */
  private dirNameOf(vm: GuestDirVm): string | null {
    const had = this.names.get(vm);
    if (had && had.uuid === vm.uuid && had.name === vm.name) return had.dir;
    const dir = guestDirName(vm.uuid, vm.name);
    this.names.set(vm, { uuid: vm.uuid, name: vm.name, dir });
    return dir;
  }

  /** The directory `name`'s VM this sample, written; or refused, or left alone. */
  private publish(name: string, vms: GuestDirVm[]): void {
    const p = this.published.get(name) ?? this.adopt(name, vms);
    if (p === null) return;
    const vm = this.owner(p, vms);
    if (typeof vm === 'string') {
      // Said once while the same processes claim it.
      if (vm !== p.unbound)
        this.limiter.warn(
          'guest dir unbound',
          { guestDir: p.dir.path, vm: vms.map((v) => v.vmId) },
          cannot(`publish into ${p.dir.path}`, vm),
        );
      p.unbound = vm;
      return;
    }
    p.unbound = '';
    try {
      if (vm.vmId !== p.vmId) this.switchTo(p, vm);
      const every = p.watched ? GUEST_AUDIT_EVERY_WATCHED : GUEST_AUDIT_EVERY;
      if ((++p.samples % every === 0 || p.dir.changed()) && !this.audit(name, p, vms)) return;
      if (!p.final) this.write(p);
    } catch (e) {
      if (!(e instanceof WriteFailure)) return this.refuse(name, (e as Error).message, vms);
      // A full file system: nothing refused, every zone written again at the next sample.
      p.failed = true;
      this.limiter.warn('guest dir write', { guestDir: p.dir.path }, `${e.message}; tried again at the next sample`);
    }
  }

  /** The one VM the directory is bound to (docs/guest.md): of those naming it and bound, the live one, else the ended; or why none. */
  private owner(p: Published, vms: GuestDirVm[]): GuestDirVm | string {
    // The usual case, one VM naming it, decided without arrays.
    if (vms.length === 1 && this.bound(p, vms[0]!)) return vms[0]!;
    const mine = vms.filter((v) => this.bound(p, v));
    const live = mine.filter((v) => v.live);
    // Any local user can start a process with a VM's UUID: two live claimants, and neither is written.
    if (live.length > 1)
      return `${live.length} live VMs bound to it name it (pids ${live.map((v) => v.pid).join(', ')}); not written until one of them ends`;
    const vm = live[0] ?? mine.at(-1);
    if (vm !== undefined) return vm;
    const by = rootOrHelper(p.dir.owner) ? `in its group (gid ${p.dir.group}) or run by root` : `run by its owner (uid ${p.dir.owner})`;
    const pids = vms.map((v) => `${v.pid} (uid ${v.uid})`).join(', ');
    return `the processes naming it, ${pids}, are not ${by}: not written for them; give the directory to the VM's group (chgrp) or its user`;
  }

  /** Whether `vm` may have the directory (docs/guest.md "Which VM a directory is bound to"), asked of /proc once per VM. */
  private bound(p: Published, vm: GuestDirVm): boolean {
    let b = p.bound.get(vm.vmId);
    if (b !== undefined) return b;
    b = rootOrHelper(p.dir.owner) ? rootOrHelper(vm.uid) || this.source.inGroup(vm, p.dir.group) : vm.uid === p.dir.owner;
    // Bounded by the VMs that name it; forgotten whole past that (asked again).
    if (p.bound.size >= 64) p.bound.clear();
    p.bound.set(vm.vmId, b);
    return b;
  }

  private adopt(name: string, vms: GuestDirVm[]): Published | null {
    const root = this.rootFd!;
    const opened = SafeDir.open(root, this.root, name, [0, EUID, ...new Set(vms.map((v) => v.uid))]);
    if (!opened.ok) {
      if (opened.error !== null) this.refuse(name, opened.error, vms);
      return null;
    }
    if (this.refused.get(name) === SafeDir.signatureOf(root, name)) {
      opened.value.close();
      return null;
    }
    if (this.source.canOpen && !this.source.canOpen(GUEST_DIR_FDS, `the guest directory ${opened.value.path}`)) {
      opened.value.close();
      this.limiter.warn(
        'guest dir fds',
        { guestDir: opened.value.path },
        cannot(`publish into ${opened.value.path}`, 'no fds left in the budget', 'raise LimitNOFILE='),
      );
      return null;
    }
    const p = new Published(opened.value);
    this.published.set(name, p);
    this.refused.delete(name);
    // Watched before its first check: whatever changes after it is told.
    if (this.watch) p.watched = p.dir.watchWith(this.watch);
    // The helper's directory: made its own (no one else writes or reads it) before it is checked.
    const closed = p.dir.restrict(this.source.readers(p.dir.owner));
    if (closed !== null) {
      this.refuse(name, closed, vms);
      return null;
    }
    p.readersOf = p.dir.owner;
    if (!this.audit(name, p, vms)) return null;
    return p;
  }

  /** Checks the directory; refuses it (false) when it holds something hostile. */
  private audit(name: string, p: Published, vms: GuestDirVm[]): boolean {
    p.settled = false;
    const why = p.dir.audit();
    if (p.dir.movedAside.length > 0) {
      const moved = p.dir.movedAside.splice(0);
      this.limiter.warn(
        'guest dir planted',
        { guestDir: p.dir.path, moved },
        `entries planted in ${p.dir.path} while others could write it moved aside: ${moved.join(', ')}`,
      );
    }
    if (why !== null) {
      this.refuse(name, why, vms);
      return false;
    }
    if (p.stats !== null && p.dir.inodeOf(GUEST_STATS_FILE) !== p.stats.ino) p.stats = p.stats.close();
    return true;
  }

  /** Another VM takes the directory (a VM started again with the same UUID): its counters go on from the files' values. */
  private switchTo(p: Published, vm: GuestDirVm): void {
    // Readable by the new VM's user (and no longer by the last one's) before anything of it is written.
    if (vm.uid !== p.readersOf) {
      const why = p.dir.restrict(this.source.readers(vm.uid));
      if (why !== null) throw new Error(why);
      p.readersOf = vm.uid;
    }
    p.vmId = vm.vmId;
    p.zones.clear();
    p.stats = p.stats?.close() ?? null;
    p.final = false;
    p.settled = false;
  }

  /** The VM's tree now, its zones' values from its statistics file's this sample (nothing when the VM is gone). */
  private write(p: Published): void {
    // The daemon writes it no more: a new file, of the VM's new shape.
    if (p.stats !== null && !p.stats.copy.current) p.stats = p.stats.close();
    const fresh = p.stats === null;
    if (fresh) p.stats = GuestStatsFile.create(p.dir, GUEST_STATS_FILE, (map) => this.source.statsCopy(p.vmId, map));
    const file = p.stats;
    if (file === null) return;
    // After a failed write every zone is written again (its words may have moved with no file written).
    const again = fresh || p.failed;
    p.failed = false;
    const quiet = !file.valuesMoved() && !again;
    if (quiet && p.settled) return;
    for (const z of file.zones) {
      if (!again && (quiet || file.unchanged(z)) && this.shows(p, z)) continue;
      this.show(p, z.id, z.name, file.energyOf(z));
    }
    p.settled = true;
    if (file.copy.totals.ended) p.final = true;
  }

  private shows(p: Published, z: { id: string; name: string }): boolean {
    const s = p.zones.get(z.id);
    return s !== undefined && s.name === z.name && p.dir.holds(z.id);
  }

  /** A zone's energy_uj showing `energyUj` (the VM's, µJ) from where its count goes on; written only when it changed. */
  private show(p: Published, id: string, name: string, energyUj: bigint): void {
    let s = p.zones.get(id);
    // A zone new, renamed, or its directory moved away (let go at the audit): made (again).
    if (s === undefined || s.name !== name || !p.dir.holds(id)) {
      s = this.makeZone(p.dir, id, name, energyUj);
      p.zones.set(id, s);
    }
    const shown = s.base + energyUj - s.start;
    if (shown === s.shown) return;
    p.dir.update(id, ENERGY_UJ, energyText(shown));
    s.shown = shown;
  }

  /** A zone's directory, attributes and class link; its count goes on from what its energy_uj held (0 when new). */
  private makeZone(dir: SafeDir, id: string, name: string, energyUj: bigint): ZoneState {
    for (const a of zoneAttributes({ name })) dir.write(id, a.file, a.text);
    dir.link(POWERCAP_CLASS_DIR, id, classLinkTarget(id));
    const held = dir.readCount(id, ENERGY_UJ);
    if (held === null) return { name, base: 0n, start: 0n, shown: -1n };
    return { name, base: held, start: energyUj, shown: held };
  }

  private unpublish(name: string): void {
    const p = this.published.get(name);
    if (!p) return;
    p.stats?.close();
    p.dir.close();
    this.published.delete(name);
  }

  /** One log line (rate-limited), and nothing written there until the directory changes. */
  private refuse(name: string, why: string, vms: GuestDirVm[]): void {
    this.unpublish(name);
    if (this.rootFd === null) return;
    const sig = SafeDir.signatureOf(this.rootFd, name);
    if (this.refused.get(name) === sig) return;
    this.refused.set(name, sig);
    this.limiter.warn(
      'guest dir refused',
      { guestDir: `${this.root}/${name}`, vm: vms.map((v) => v.vmId) },
      cannot(`publish into ${this.root}/${name}`, why, 'nothing is written there until it is fixed (docs/guest.md)'),
    );
    this.log.debug({ name }, 'guest directory refused');
  }
}
