#!/usr/bin/env node
import { main } from '../cli/cli.js';

await main(process.argv);
