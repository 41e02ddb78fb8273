/**
 * Evaluated before any other module of the executable (the entry's first import; ESM evaluates a
 * module's imports in order, depth first): from here on SIGUSR1 cannot open Node's inspector
 * (os/inspector-guard.ts). Keep it first, and keep its imports to that one module.
 */
import { installSigusr1Guard } from '../os/inspector-guard.js';

installSigusr1Guard();
