/** Evaluated first: SIGUSR1 cannot open the inspector, a re-executed image holds SIGHUP for its handler. Keep to these two imports. */
import { installSigusr1Guard } from '../os/inspector-guard.js';
import { holdSighupAfterExec } from '../os/sighup-hold.js';

installSigusr1Guard();
holdSighupAfterExec();
