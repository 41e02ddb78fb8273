#!/usr/bin/env node
// First, before any other module is evaluated: SIGUSR1 must never open Node's inspector (guard.ts).
import './guard.js';
import { main } from '../cli/cli.js';

await main(process.argv);
