/** `vmsr-helper limit [VM [WATTS|off] [--domain D]]`: docs/power-limits.md; setting is for root and the helper's --socket-group. */
import type { Command } from 'commander';
import { V2Client } from '../../client/v2-client.js';
import { V2Error, type VmInfo } from '../../client/v2-replies.js';
import { findVm } from '../../client/find-vm.js';
import { cannotError } from '../../common/errors.js';
import type { LimitState } from '../../protocol/v2/codec.js';
import { addClientSocketOption, clientSocket, commandOptions } from '../options.js';
import { ENERGY_DOMAINS, isEnergyDomain, type EnergyDomain } from '../../model/domains.js';

/** --domain as typed: a RAPL domain as ENERGY_DOMAINS names it. */
function domainArg(text: string): EnergyDomain {
  if (isEnergyDomain(text)) return text;
  throw cannotError(`limit the ${JSON.stringify(text)} power`, 'it is not a RAPL domain', `name one of ${ENERGY_DOMAINS.join(', ')}`);
}

/** WATTS as typed: a positive number of watts, or `off`; null for off. */
function parseWatts(text: string): number | null {
  if (text === 'off') return null;
  const w = /^\d{1,7}(\.\d{1,3})?$/.test(text) ? Number(text) : NaN;
  if (!(w > 0))
    throw cannotError(
      `set the limit ${JSON.stringify(text)}`,
      'it is not a number of watts above 0',
      "give watts (e.g. 35 or 12.5) or 'off'",
    );
  return w;
}

/** One line of the listing: the VM, its limit, the quota in force and the time limited. */
function line(vm: VmInfo, s: LimitState): string {
  const name = vm.name === null ? `pid ${vm.pid}` : `${JSON.stringify(vm.name)} pid ${vm.pid}`;
  const quota = s.quotaUs === 0 ? 'not biting' : `quota ${((s.quotaUs / s.periodUs) * 100).toFixed(0)} % of a CPU`;
  const on = s.domain ?? 'package';
  const limit =
    s.limitMw === 0 ? `no ${on} limit` : `${on} limit ${s.limitMw / 1000} W, ${quota}, limited ${(Number(s.limitedNs) / 1e9).toFixed(0)} s`;
  return `${name}: ${limit}\n`;
}

/** Every limit of the live VMs, a line each, package first; a domain the helper refuses (an ERROR) is not asked again. */
async function listLimits(client: V2Client, live: readonly VmInfo[]): Promise<string[]> {
  const out: string[] = [];
  const domains = new Set<EnergyDomain>(ENERGY_DOMAINS);
  for (const v of live)
    for (const d of domains) {
      const s = await client.limit(v.hostVmId, undefined, d).catch((e: unknown) => {
        if (!(e instanceof V2Error) || d === 'package') throw e;
        domains.delete(d);
        return null;
      });
      if (s !== null && s.limitMw > 0) out.push(line(v, s));
    }
  return out;
}

export function addLimitCommand(program: Command): void {
  const cmd = program
    .command('limit')
    .argument('[vm]', "the VM: its name as 'virsh list' shows it, its UUID or its pid")
    .argument('[watts]', "its limit in watts, or 'off'")
    .option('--domain <domain>', `the RAPL domain whose attributed power is limited: ${ENERGY_DOMAINS.join(', ')}`, domainArg, 'package')
    .description("set, remove or list per-VM power limits (the VM's CPU quota follows its attributed power)");
  addClientSocketOption(cmd).action(async (target?: string, watts?: string) => {
    const o = commandOptions<{ socket?: string; domain: EnergyDomain }>(cmd);
    const client = await V2Client.connect(clientSocket(o));
    try {
      const vms = await client.list();
      if (target === undefined) {
        const live = vms.filter((v) => !v.ended);
        const limited = await listLimits(client, live);
        process.stdout.write(limited.length === 0 ? 'no VM has a power limit\n' : limited.join(''));
        return;
      }
      const vm = findVm(vms, target, 'vmsr-helper limit');
      const state = await client.limit(vm.hostVmId, watts === undefined ? undefined : parseWatts(watts), o.domain);
      process.stdout.write(line(vm, state));
    } finally {
      await client.close();
    }
  });
}
