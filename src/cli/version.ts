import { findPackage } from '../os/package-info.js';
import { cannotError } from '../common/errors.js';

const pkg = findPackage();
if (pkg === undefined)
  throw cannotError('find the vmsr-helper package.json above this module', 'the installation is incomplete', 'reinstall vmsr-helper');

export const VERSION: string = pkg.version;
