# gdb command file: lets a real QEMU (9.1 or newer) start with -accel kvm,rapl=true on a host whose
# CPU is not Intel, for tests only.
#
# Why: QEMU's RAPL start-up refuses any host whose CPUID vendor is not GenuineIntel
# (is_host_cpu_intel() in target/i386/kvm/vmsr_energy.c). Test machines are often AMD VMs. The
# check is one function returning a bool, so gdb stops there once, makes it return true, and lets
# go of the process: everything after it (the helper socket, the MSR reads, the vmsr thread, the
# guest's RDMSR exits) is stock QEMU, untouched.
#
# How it is used (test/support/rapl-qemu.ts):
#   gdb -batch -x qemu-intel-check.gdb --args qemu-system-x86_64 -accel kvm,rapl=true,... -pidfile F
# gdb returns once QEMU is past the check and QEMU keeps running, reparented. Never with -daemonize
# (gdb would stay with the parent that exits). The other RAPL check (sysfs
# /sys/class/powercap/intel-rapl/enabled reads 1) is met by a private mount namespace, not here.
set pagination off
set confirm off
# QEMU kicks vCPU threads with SIGUSR1; let those through silently while gdb is attached.
handle SIGUSR1 nostop noprint pass
handle SIGUSR2 nostop noprint pass
break is_host_cpu_intel
run
# Leave the function at once with "true" as its result.
return (_Bool)1
delete
detach
quit
