/** Keeps the exporter connected to the helper daemon and the book fed (docs/exporter.md "How it follows the daemon"). */
import type { Logger } from 'pino';
import { V2Error, type VmInfo } from '../client/v2-replies.js';
import { E } from '../protocol/v2/codec.js';
import type { EnergyBook } from './energy-book.js';
import { cannot } from '../common/errors.js';
import { StatsReader } from '../client/stats-reader.js';
import type { V2Client } from '../client/v2-client.js';
import { StatsFdFeed } from './stats-fd-feed.js';

/** What the exporter needs from a v2 connection: LIST and the statistics fds (of a VM, or of the host: 0). */
export type ObserverClient = Pick<V2Client, 'list' | 'statsFd' | 'closed' | 'close'>;

/** 250 ms after a loss (a restarting daemon is back within that), doubling to 10 s. */
export const DEFAULT_BACKOFF = { firstMs: 250, maxMs: 10_000 };
export type Backoff = typeof DEFAULT_BACKOFF;

/** Delay before reconnect attempt `attempt` (0-based). */
export function backoffDelay(b: Backoff, attempt: number): number {
  return Math.min(b.maxMs, b.firstMs * 2 ** Math.min(attempt, 30));
}

interface SessionOptions {
  connect: () => Promise<ObserverClient>;
  book: EnergyBook;
  log: Logger;
  backoff?: Backoff;
  socketPath: string;
}

export class ObserverSession {
  private stopped = false;
  private client: ObserverClient | null = null;
  private wake: (() => void) | null = null;
  private readonly done: Promise<void>;
  /** The LIST running now and its connection, if any; `relist` asks for one more after it. */
  private listing: { client: ObserverClient; done: Promise<void> } | null = null;
  private relist = false;
  /** Skipped-VM count last logged, so a steady state is logged once, not at every LIST. */
  private skippedLogged = 0;
  /** The values read from the helper's statistics fds at scrape time, while connected. */
  private feed: StatsFdFeed | null = null;
  /** Attempts failed in a row (the backoff's exponent). */
  private failures = 0;
  /** When the helper was lost, until observed again (for the reconnection's log line). */
  private downSince: number | null = null;
  /** The refusal was logged at error level; later ones go to debug. */
  private refusedLogged = false;

  constructor(private readonly o: SessionOptions) {
    this.done = this.run();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.wake?.();
    await this.client?.close().catch(() => {});
    await this.done;
  }

  private async run(): Promise<void> {
    const backoff = this.o.backoff ?? DEFAULT_BACKOFF;
    while (!this.stopped) {
      const client = await this.connect(backoff);
      if (client === null) continue;
      if (this.stopped) {
        await client.close().catch(() => {});
        break;
      }
      this.client = client;
      this.o.book.connectionStarted();
      // Refused (not in the observer group): the next attempt comes after backoff.maxMs, as logged.
      let refused = false;
      try {
        await this.observe(client);
      } catch (e) {
        refused = this.failed(e as Error, backoff);
        await client.close().catch(() => {});
      }
      this.stopFeed();
      this.client = null;
      this.o.book.connectionLost();
      if (this.stopped) break;
      this.downSince ??= Date.now();
      await this.sleep(refused ? backoff.maxMs : backoffDelay(backoff, this.failures++));
    }
  }

  /** One connection attempt; null when the helper cannot be reached (logged once, then after the backoff's delay). */
  private async connect(backoff: Backoff): Promise<ObserverClient | null> {
    try {
      return await this.o.connect();
    } catch (e) {
      const { log } = this.o;
      const delay = backoffDelay(backoff, this.failures++);
      if (this.failures === 1)
        log.warn(
          { err: (e as Error).message },
          cannot(`reach the helper at ${this.o.socketPath}`, (e as Error).message, `retrying every ${backoff.maxMs / 1000} s at most`),
        );
      else log.debug({ err: (e as Error).message, delayMs: delay }, 'helper still unreachable');
      this.downSince ??= Date.now();
      await this.sleep(delay);
      return null;
    }
  }

  /** Observes the helper through its statistics fds until the connection ends (logged: a reconnection with the outage's length). */
  private async observe(client: ObserverClient): Promise<void> {
    const { book, log } = this.o;
    this.startFeed(client, await client.statsFd(0));
    await this.requestList(client);
    this.failures = 0;
    log.info(
      {
        socket: this.o.socketPath,
        vms: book.size,
        downMs: this.downSince === null ? undefined : Date.now() - this.downSince,
      },
      this.downSince === null ? `observing the helper at ${this.o.socketPath}` : `reconnected to the helper at ${this.o.socketPath}`,
    );
    this.downSince = null;
    this.refusedLogged = false;
    const reason = await client.closed;
    if (!this.stopped) log.warn({ err: reason?.message }, `lost the helper connection${reason ? `: ${reason.message}` : ''}; reconnecting`);
  }

  /** Logs why a connection ended; true when the helper refused this exporter (the next attempt waits backoff.maxMs). */
  private failed(err: Error, backoff: Backoff): boolean {
    const { log } = this.o;
    if (err instanceof V2Error && err.code === E.NOT_PERMITTED) {
      // A configuration problem: said once, loudly; retried quietly in case the group is fixed.
      // The helper's message says which group (by name); the unit's setting is added here.
      if (!this.refusedLogged)
        log.error(
          { uid: process.getuid?.() },
          `the helper refuses this exporter: ${err.helperMessage} (SupplementaryGroups= in the exporter's unit); retrying every ${backoff.maxMs / 1000} s`,
        );
      else log.debug({ err: err.message }, 'still refused by the helper');
      this.refusedLogged = true;
      return true;
    }
    if (!this.stopped) log.warn({ err: err.message }, `helper connection failed: ${err.message}; reconnecting`);
    return false;
  }

  /** The host's statistics fd into a feed, and the scrape hook that reads it and every VM's. */
  private startFeed(client: ObserverClient, host: { fd: number }): void {
    const feed = new StatsFdFeed(this.o.book, StatsReader.open(host.fd));
    this.feed = feed;
    this.o.book.beforeScrape = async () => {
      if (this.feed !== feed) return;
      try {
        if (feed.readHost()) await this.requestList(client);
        feed.readVms();
      } catch (e) {
        this.o.log.warn({ err: (e as Error).message }, cannot("read the helper's statistics fds", (e as Error).message));
      }
    };
  }

  private stopFeed(): void {
    this.feed?.close();
    this.feed = null;
    this.o.book.beforeScrape = null;
  }

  /** At most one LIST in flight; a request meanwhile runs one more after it (VMs changed again). */
  private requestList(client: ObserverClient): Promise<void> {
    if (this.listing?.client === client) {
      this.relist = true;
      return this.listing.done;
    }
    const done = this.listAndObserve(client).finally(() => {
      if (this.listing?.done === done) this.listing = null;
    });
    this.listing = { client, done };
    return done;
  }

  private async listAndObserve(client: ObserverClient): Promise<void> {
    const { book, log } = this.o;
    do {
      this.relist = false;
      const list = await client.list();
      if (this.client !== client) return;
      const { observe, skipped } = book.listed(list);
      if (skipped.length === 0 && this.skippedLogged > 0) log.info('every VM is exported again');
      else if (skipped.length > 0 && skipped.length !== this.skippedLogged)
        log.warn(
          { skipped: skipped.length, first: describe(skipped[0]!) },
          `${skipped.length} VM(s) not exported (over --max-vms, or a name/uuid/pid/uid already in use); raise --max-vms to export more`,
        );
      this.skippedLogged = skipped.length;
      const feed = this.feed;
      if (feed === null) return;
      await Promise.all(observe.map((vm) => this.openVmFile(client, feed, vm)));
      if (observe.length) log.debug({ read: observe.length }, 'reading new VMs through their statistics fds');
    } while (this.relist && this.client === client);
  }

  /** One VM's statistics fd into the feed, its values in the book at once. */
  private async openVmFile(client: ObserverClient, feed: StatsFdFeed, vm: VmInfo): Promise<void> {
    try {
      const r = StatsReader.open((await client.statsFd(vm.hostVmId)).fd);
      if (this.feed !== feed) return r.close();
      feed.add(vm.hostVmId, r);
    } catch (e) {
      // Ended between LIST and STATS_FD, not ours to see, or the helper out of fds (ERROR 4 names the fix).
      this.o.book.unobserved(vm.hostVmId);
      this.o.log.debug({ vm: describe(vm), err: (e as Error).message }, 'cannot read VM');
    }
  }

  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const wake = () => {
        clearTimeout(timer);
        this.wake = null;
        resolve();
      };
      const timer = setTimeout(wake, ms);
      this.wake = wake;
    });
  }
}

function describe(vm: VmInfo): string {
  return `${vm.name ?? '(unnamed)'} pid ${vm.pid}`;
}
