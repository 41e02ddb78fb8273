/**
 * Evaluated before any other module of the executable (the entry imports only this module
 * statically, and the program once it has run): from here on SIGUSR1 cannot open Node's inspector
 * (os/inspector-guard.ts), and in an image the daemon executed again a SIGHUP is held until the
 * daemon's handler takes it (os/sighup-hold.ts). Keep it first, and keep its imports to those two.
 */
import { installSigusr1Guard } from '../os/inspector-guard.js';
import { holdSighupAfterExec } from '../os/sighup-hold.js';

installSigusr1Guard();
holdSighupAfterExec();
