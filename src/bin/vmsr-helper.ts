#!/usr/bin/env node
import { main } from '../helper/cli.js';

await main(process.argv);
