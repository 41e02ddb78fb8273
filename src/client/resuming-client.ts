/**
 * A v2 client that outlives helper restarts: connects, REGISTERs (same vm_id and totals) and subscribes again; a request in
 * flight rejects; statistics fds keep the old image's last values: ask again after `onResumed`.
 */
import { cannot } from '../common/errors.js';
import { E } from '../protocol/v2/codec.js';
import type { VcpuSpec } from '../model/vcpus.js';
import { V2Client } from './v2-client.js';
import {
  V2ConnectionError,
  V2Error,
  type HostUpdate,
  type Registered,
  type SubscribeOptions,
  type Update,
  type VmInfo,
  type VmUpdate,
} from './v2-replies.js';

interface ResumingOptions {
  /** How long to try connecting again after a close (default RESUME_FOR_MS). */
  resumeForMs?: number;
  onResumed?: (o: { reason: Error | null; awayMs: number }) => void;
  connect?: (socketPath: string) => Promise<V2Client>;
}

/** Default of `resumeForMs`: a restart takes about a second; a package upgrade's stop and start, a few. */
const RESUME_FOR_MS = 60_000;
/** First wait between attempts to connect again, doubled up to RETRY_MAX_MS. */
const RETRY_FIRST_MS = 25;
const RETRY_MAX_MS = 1_000;

/** A subscription (SUBSCRIBE, OBSERVE or HOST_SUBSCRIBE): `start` makes it on a connection, again on each resumption. */
interface Follower {
  start: (c: V2Client) => Promise<unknown>;
  onError?: ((e: V2Error) => void) | undefined;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

export class ResumingV2Client {
  /** Registrations made through this client, by vm_id: REGISTERed again after a restart. */
  private readonly registered = new Map<number, { pid: number; vcpus: readonly VcpuSpec[] }>();
  /** By request and id: "subscribe 3", "observe 7", "host". */
  private readonly followers = new Map<string, Follower>();
  private current: Promise<V2Client>;
  private userClosed = false;
  /** Resolves when the client is closed by close(), or gave up resuming (with why). */
  readonly closed: Promise<Error | null>;
  private resolveClosed!: (e: Error | null) => void;

  private constructor(
    private readonly socketPath: string,
    first: V2Client,
    private readonly o: ResumingOptions,
  ) {
    this.closed = new Promise((r) => (this.resolveClosed = r));
    this.current = Promise.resolve(first);
    this.resumeAfter(first);
  }

  /** Connects (once: a helper that is not there now is an error, as for V2Client.connect). */
  static async connect(socketPath: string, o: ResumingOptions = {}): Promise<ResumingV2Client> {
    const first = await (o.connect ?? V2Client.connect)(socketPath);
    return new ResumingV2Client(socketPath, first, o);
  }

  /** The connection requests go to: the current one, or the next one while resuming. */
  ready(): Promise<V2Client> {
    return this.current;
  }

  async register(o: { pid?: number; vcpus: readonly VcpuSpec[] }): Promise<Registered> {
    const r = await (await this.current).register(o);
    this.registered.set(r.vmId, { pid: o.pid ?? 0, vcpus: o.vcpus });
    return r;
  }

  async unregister(vmId: number): Promise<void> {
    this.registered.delete(vmId);
    this.followers.delete(`subscribe ${vmId}`);
    await (await this.current).unregister(vmId);
  }

  async list(): Promise<VmInfo[]> {
    return (await this.current).list();
  }

  async statsFd(hostVmId: number): Promise<{ fd: number; fileSize: number }> {
    return (await this.current).statsFd(hostVmId);
  }

  subscribe(vmId: number, onUpdate: (u: Update) => void, onError?: (e: V2Error) => void, o: SubscribeOptions = {}): Promise<Update> {
    return this.follow(`subscribe ${vmId}`, onUpdate, onError, (c, u) => c.subscribe(vmId, u, onError, o));
  }

  observe(hostVmId: number, onUpdate: (u: VmUpdate) => void, onError?: (e: V2Error) => void, o: SubscribeOptions = {}): Promise<VmUpdate> {
    return this.follow(`observe ${hostVmId}`, onUpdate, onError, (c, u) => c.observe(hostVmId, u, onError, o));
  }

  subscribeHost(onUpdate: (u: HostUpdate) => void, onError?: (e: V2Error) => void, o: SubscribeOptions = {}): Promise<HostUpdate> {
    return this.follow('host', onUpdate, onError, (c, u) => c.subscribeHost(u, onError, o));
  }

  /** Subscription `key` made with `start` now and on each resumption until a VM's last update; a failed start leaves nothing. */
  private async follow<U extends object>(
    key: string,
    onUpdate: (u: U) => void,
    onError: ((e: V2Error) => void) | undefined,
    start: (c: V2Client, onUpdate: (u: U) => void) => Promise<U>,
  ): Promise<U> {
    const f: Follower = { start: (c) => start(c, relay), onError };
    const relay = (u: U) => {
      if (this.followers.get(key) !== f) return;
      if ('ended' in u && u.ended === true) this.followers.delete(key);
      onUpdate(u);
    };
    this.followers.set(key, f);
    try {
      return await start(await this.current, relay);
    } catch (e) {
      if (this.followers.get(key) === f) this.followers.delete(key);
      throw e;
    }
  }

  async close(): Promise<void> {
    this.userClosed = true;
    const c = await this.current.catch(() => null);
    await c?.close();
    this.resolveClosed(null);
  }

  private resumeAfter(c: V2Client): void {
    void c.closed.then((reason) => {
      if (this.userClosed) return;
      const away = Date.now();
      let resolveNext!: (c: V2Client) => void;
      let rejectNext!: (e: Error) => void;
      this.current = new Promise<V2Client>((res, rej) => ((resolveNext = res), (rejectNext = rej)));
      // A request made while resuming waits; one made after giving up rejects with why.
      this.current.catch(() => {});
      void this.resume(reason).then(
        (next) => {
          if (this.userClosed) {
            void next.close();
            return rejectNext(new V2ConnectionError('the client was closed'));
          }
          resolveNext(next);
          this.resumeAfter(next);
          this.o.onResumed?.({ reason, awayMs: Date.now() - away });
        },
        (e: Error) => {
          rejectNext(e);
          this.resolveClosed(e);
        },
      );
    });
  }

  /** Connects again and restores every registration and subscription, retrying until resumeForMs. */
  private async resume(reason: Error | null): Promise<V2Client> {
    const deadline = Date.now() + (this.o.resumeForMs ?? RESUME_FOR_MS);
    let wait = RETRY_FIRST_MS;
    let last: Error | null = reason;
    while (!this.userClosed) {
      let c: V2Client | null = null;
      try {
        c = await (this.o.connect ?? V2Client.connect)(this.socketPath);
        await this.restore(c);
        return c;
      } catch (e) {
        last = e as Error;
        if (c) void c.close();
        // A refusal that a retry cannot change (a registration the helper no longer accepts) ends it.
        if (e instanceof V2Error && e.code !== E.RESTARTING) throw e;
      }
      if (Date.now() + wait > deadline) break;
      await sleep(wait);
      wait = Math.min(wait * 2, RETRY_MAX_MS);
    }
    throw new V2ConnectionError(
      cannot(
        `resume the connection to the helper at ${this.socketPath}`,
        `it did not come back within ${Math.round((this.o.resumeForMs ?? RESUME_FOR_MS) / 1000)} s (${last?.message ?? 'closed'})`,
        'check that the helper runs (systemctl status qemu-vmsr-helper, or its log)',
      ),
    );
  }

  /** Everything again on `c`; a VM refused (ended) or given another vm_id (state lost) is dropped and told to onError; HOST_SUBSCRIBE refused rejects. */
  private async restore(c: V2Client): Promise<void> {
    for (const [vmId, r] of [...this.registered]) {
      let why: string | null = null;
      try {
        const again = await c.register({ pid: r.pid, vcpus: r.vcpus });
        if (again.vmId !== vmId) {
          await c.unregister(again.vmId).catch(() => {});
          why = `the helper restarted without its state and registered the process again as VM ${again.vmId}, with totals from 0`;
        }
      } catch (e) {
        if (!(e instanceof V2Error)) throw e;
        why = `the helper refused to register it again (${e.message})`;
      }
      if (why === null) continue;
      this.registered.delete(vmId);
      this.drop(`subscribe ${vmId}`, new V2Error(E.NO_SUCH, 0, cannot(`resume VM ${vmId}`, why, 'register it again')));
    }
    await Promise.all(
      [...this.followers].map(([key, f]) =>
        f.start(c).catch((e: Error) => {
          if (!(e instanceof V2Error) || key === 'host') throw e;
          this.drop(key, e);
        }),
      ),
    );
  }

  private drop(key: string, why: V2Error): void {
    const f = this.followers.get(key);
    this.followers.delete(key);
    f?.onError?.(why);
  }
}
