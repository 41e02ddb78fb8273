/**
 * The VMs' fds shared out (KeptFdLedger), and whether a new VM fits: one VM keeps at most
 * --max-vm-threads threads' fds, each uid its share (uid-share.ts), all of them the fd budget
 * (fd-budget.ts). A process over a bound is sampled from the threads it keeps.
 */
import { fail } from '../common/result.js';
import { UID_SHARE, UidShares, shareOf, type ShareOwner } from './uid-share.js';
import type { FdAdmission, FdBudget, FdUsage } from './fd-budget.js';
import { keptFds, type KeptFdLedger } from '../os/proc-tasks.js';

interface VmFdSharesOptions {
  budget: Pick<FdBudget, 'room' | 'vmCapacity' | 'canAdmit' | 'canOpen' | 'admitted'> & Partial<Pick<FdBudget, 'usage'>>;
  maxVmThreads: number;
  /** Null when the process is gone. */
  owner: (pid: number) => ShareOwner | null;
}

interface Holder {
  owner: ShareOwner;
  fds: number;
}

/** Who a gone process counts as: nobody preferred, no uid (its opens fail and are given back at once). */
const GONE: ShareOwner = { uid: -1, preferred: false };

export class VmFdShares implements KeptFdLedger {
  private readonly shares: UidShares;
  private readonly holders = new Map<number, Holder>();
  private readonly perVm: number;

  constructor(private readonly o: VmFdSharesOptions) {
    if (!Number.isSafeInteger(o.maxVmThreads) || o.maxVmThreads < 1)
      throw new RangeError(`the most threads per VM must be a whole number >= 1, got ${o.maxVmThreads}`);
    this.shares = new UidShares(o.budget.vmCapacity);
    this.perVm = keptFds(o.maxVmThreads);
  }

  /** Fds held by the processes of `uid` (tests, logs). */
  heldBy(uid: number): number {
    return this.shares.heldBy(uid);
  }

  /** Whether a new VM's process fits whole (up to --max-vm-threads threads) in its owner's share and the budget. */
  canAdmit(threads: number, pid?: number): FdAdmission {
    const kept = Math.min(Math.max(1, threads), this.o.maxVmThreads);
    const owner = pid === undefined ? null : this.o.owner(pid);
    if (owner !== null) {
      const need = keptFds(kept) - (this.holders.get(pid!)?.fds ?? 0);
      const { room, bound } = this.shares.room(owner);
      if (need > room && bound !== 'capacity') return fail(this.shareMessage(owner, need, room, bound));
    }
    return this.o.budget.canAdmit(kept);
  }

  readonly canOpen = (n: number, what: string): FdAdmission => this.o.budget.canOpen(n, what);
  readonly usage = (): FdUsage | null => this.o.budget.usage?.() ?? null;

  grant(pid: number, n: number, atLeast: number): number {
    let h = this.holders.get(pid);
    if (h === undefined) {
      h = { owner: this.o.owner(pid) ?? GONE, fds: 0 };
      this.holders.set(pid, h);
    }
    const cap = Math.min(n, this.perVm - h.fds, this.o.budget.room());
    const got = this.shares.take(h.owner, Math.max(0, cap), Math.min(n, atLeast));
    this.o.budget.admitted(got);
    h.fds += got;
    if (h.fds === 0) this.holders.delete(pid);
    return got;
  }

  release(pid: number, n: number): void {
    const h = this.holders.get(pid);
    if (h === undefined || n <= 0) return;
    const back = Math.min(n, h.fds);
    this.shares.give(h.owner, back);
    h.fds -= back;
    if (h.fds === 0) this.holders.delete(pid);
  }

  private shareMessage(owner: ShareOwner, need: number, room: number, bound: 'uid' | 'others'): string {
    const whose =
      bound === 'uid'
        ? `uid ${owner.uid} holds ${this.shares.heldBy(owner.uid)} of the ${shareOf(this.shares.capacity, UID_SHARE)} fds one uid may hold`
        : `uids other than root and --socket-group hold ${this.shares.others} of the fds they may hold together`;
    return (
      `not enough file descriptors in its owner's share: its threads need ${need}, ${room} are left (${whose}); ` +
      "VMs of root or of --socket-group's members are not bound by it; raise the helper's open-file limit (LimitNOFILE=, ulimit -n) to grow every share"
    );
  }
}
