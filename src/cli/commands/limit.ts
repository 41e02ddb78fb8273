/**
 * `vmsr-helper limit [VM [WATTS|off]]`: a VM's power limit set, removed, or every limit listed
 * (docs/power-limits.md). VMs are named as `watch` names them (client/find-vm.ts); setting is for root
 * and the helper's --socket-group.
 */
import type { Command } from 'commander';
import { V2Client } from '../../client/v2-client.js';
import { type VmInfo } from '../../client/v2-replies.js';
import { findVm } from '../../client/find-vm.js';
import { cannot } from '../../common/errors.js';
import type { LimitState } from '../../protocol/v2/codec.js';
import { DEFAULT_HELPER_SOCKET } from '../../protocol/socket-path.js';
import { addClientSocketOption, commandOptions } from '../options.js';

/** WATTS as typed: a positive number of watts, or `off`; null for off. */
function parseWatts(text: string): number | null {
  if (text === 'off') return null;
  const w = /^\d{1,7}(\.\d{1,3})?$/.test(text) ? Number(text) : NaN;
  if (!(w > 0))
    throw new Error(
      cannot(`set the limit ${JSON.stringify(text)}`, 'it is not a number of watts above 0', "give watts (e.g. 35 or 12.5) or 'off'"),
    );
  return w;
}

/** One line of the listing: the VM, its limit, the quota in force and the time limited. */
function line(vm: VmInfo, s: LimitState): string {
  const name = vm.name === null ? `pid ${vm.pid}` : `${JSON.stringify(vm.name)} pid ${vm.pid}`;
  const quota = s.quotaUs === 0 ? 'not biting' : `quota ${((s.quotaUs / s.periodUs) * 100).toFixed(0)} % of a CPU`;
  const limit = s.limitMw === 0 ? 'no limit' : `limit ${s.limitMw / 1000} W, ${quota}, limited ${(Number(s.limitedNs) / 1e9).toFixed(0)} s`;
  return `${name}: ${limit}\n`;
}

export function addLimitCommand(program: Command): void {
  const cmd = program
    .command('limit')
    .argument('[vm]', "the VM: its name as 'virsh list' shows it, its UUID or its pid")
    .argument('[watts]', "its limit on package power, in watts, or 'off'")
    .description("set, remove or list per-VM power limits (the VM's CPU quota follows its attributed power)");
  addClientSocketOption(cmd).action(async (target?: string, watts?: string) => {
    const o = commandOptions<{ socket?: string }>(cmd);
    const client = await V2Client.connect(o.socket ?? DEFAULT_HELPER_SOCKET);
    try {
      const vms = await client.list();
      if (target === undefined) {
        const live = vms.filter((v) => !v.ended);
        const states = await Promise.all(live.map((v) => client.limit(v.hostVmId)));
        const limited = live.flatMap((v, i) => (states[i]!.limitMw > 0 ? [line(v, states[i]!)] : []));
        process.stdout.write(limited.length === 0 ? 'no VM has a power limit\n' : limited.join(''));
        return;
      }
      const vm = findVm(vms, target, 'vmsr-helper limit');
      const state = await client.limit(vm.hostVmId, watts === undefined ? undefined : parseWatts(watts));
      process.stdout.write(line(vm, state));
    } finally {
      await client.close();
    }
  });
}
