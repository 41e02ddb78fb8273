// The real daemon CLI with the v2 service plugged in (until the CLI wires it itself): v2 options come
// from the VMSR_V2 environment variable as JSON ({"interval":0.2,"record":"/tmp/x.jsonl",...}).
import { registerDaemonPlugin } from '../../dist/src/helper/daemon.js';
import { v2DaemonPlugin, v2OptionsFrom } from '../../dist/src/helper/v2/service.js';
import { main } from '../../dist/src/helper/cli.js';

registerDaemonPlugin(v2DaemonPlugin(v2OptionsFrom(JSON.parse(process.env.VMSR_V2 ?? '{}'))));
await main(process.argv);
