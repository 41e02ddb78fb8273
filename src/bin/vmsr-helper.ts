#!/usr/bin/env node
// The guard first; a static import of the program would load 55 modules (0.1-0.4 s) before it, and a SIGHUP then ends the process.
import './guard.js';
import { KEEPER_ENV } from '../keeper/keeper-messages.js';

// The keeper's image, executed by the root start (docs/daemon.md "Crashes"), loads only the keeper.
if (process.env[KEEPER_ENV.image] !== undefined) await (await import('./run-keeper.js')).runKeeperImage();
// A serving process the keeper started drops the keeper's real uid 0 first (os/privileges/capabilities.ts).
if (process.env[KEEPER_ENV.channel] !== undefined) (await import('../os/privileges/capabilities.js')).takeOwnUid();
const { main } = await import('../cli/cli.js');
await main(process.argv);
