/**
 * `record --vm`: the VM the helper lists, its vCPU threads read here from /proc (refused when the process
 * is not the one listed: a reused pid), and the helper's energy source (null: not said).
 */
import { V2Client } from '../client/v2-client.js';
import { findVm } from '../client/find-vm.js';
import { ProcScanner } from '../discovery/scanner.js';
import type { VmSpec } from '../model/vm.js';
import { cannotError } from '../common/errors.js';
import { statedHost } from '../client/stated-energy-source.js';
import type { EnergySourceKind } from '../energy/kinds.js';

export async function vmSpecsFromHelper(
  socketPath: string,
  targets: readonly string[],
  procRoot: string,
  clkTck: number,
): Promise<{ vms: VmSpec[]; energySource: EnergySourceKind | null }> {
  if (targets.length === 0) return { vms: [], energySource: null };
  const client = await V2Client.connect(socketPath);
  let listed;
  let energySource;
  try {
    listed = await client.list();
    energySource = (await statedHost(client)).energySource;
  } finally {
    await client.close();
  }
  const picked = targets.map((t) => ({ target: t, vm: findVm(listed, t, 'vmsr-helper record --vm') }));
  const found = new ProcScanner(procRoot, { clkTck }).scan();
  const vms = picked.map(({ target, vm }) => {
    const d = found.find((f) => f.pid === vm.pid && BigInt(f.starttime) === vm.starttime);
    if (d === undefined) {
      throw cannotError(
        `record the VM ${JSON.stringify(target)} (pid ${vm.pid})`,
        vm.ended
          ? 'it has ended'
          : 'its process is not a VM to this scan of /proc (it ended, or the helper was given its threads by a client)',
        `give its threads with --pid ${vm.pid} --vcpus TID:VPKG,...`,
      );
    }
    return { pid: d.pid, starttime: d.starttime, vcpus: d.vcpus, ...(d.name !== null ? { name: d.name } : {}) };
  });
  return { vms, energySource };
}
