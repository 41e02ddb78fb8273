#!/usr/bin/env node
// First, before any other module is loaded: SIGUSR1 must never open Node's inspector, and a SIGHUP
// must not end an image the daemon executed again (guard.ts). The program is imported only after the
// guard ran: a static import would be loaded and linked (some 55 modules, 0.1 to 0.4 s on a busy
// host) before the guard is evaluated, and a SIGHUP meanwhile ends the process.
import './guard.js';
import { KEEPER_ENV } from '../keeper/keeper-messages.js';

// The keeper's image, executed by the root start (docs/daemon.md "Crashes"), loads only the keeper.
if (process.env[KEEPER_ENV.image] !== undefined) await (await import('./run-keeper.js')).runKeeperImage();
// A serving process the keeper started drops the keeper's real uid 0 first (os/privileges/capabilities.ts).
if (process.env[KEEPER_ENV.channel] !== undefined) (await import('../os/privileges/capabilities.js')).takeOwnUid();
const { main } = await import('../cli/cli.js');
await main(process.argv);
