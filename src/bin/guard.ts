/**
 * Evaluated before any other module of the executable: from here on SIGUSR1 cannot open Node's inspector,
 * and in an image the daemon executed again a SIGHUP is held until its handler takes it. Keep its imports to these two.
 */
import { installSigusr1Guard } from '../os/inspector-guard.js';
import { holdSighupAfterExec } from '../os/sighup-hold.js';

installSigusr1Guard();
holdSighupAfterExec();
