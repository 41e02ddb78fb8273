# gdb command file: lets QEMU's own qemu-vmsr-helper start on a host whose CPU is not Intel, so a
# test can boot the same guest once through it and once through vmsr-helper and compare.
#
# Why: the helper refuses to start unless CPUID leaf 0 says GenuineIntel. Unlike QEMU, its check is
# inlined into main() and the binary is stripped, so there is no symbol to stop at: gdb stops right
# after the CPUID instruction (at a fixed offset into the executable) and puts the Intel vendor
# string in EBX/EDX/ECX ("Genu" "ineI" "ntel"), then lets go of the process.
#
# The offset 0x3a5ee is that of Debian's qemu-system-common 1:10.0.2+ds-2+deb13u1~bpo12+1
# (bookworm-backports) build ONLY. test/support/rapl-qemu.ts checks the installed version and that
# the two bytes before the offset are CPUID (0f a2) before using this file, and skips otherwise.
#
# The helper also checks /sys/class/powercap/intel-rapl/enabled and reads /dev/cpu/N/msr itself;
# the test gives it both in a private mount namespace.
#
# Usage: gdb -batch -x qemu-vmsr-helper-intel-check.gdb --args /usr/bin/qemu-vmsr-helper -k SOCK
set pagination off
set confirm off
# Stop before the first instruction so the executable's load address (PIE) is known.
starti
python
import gdb
maps = gdb.execute('info proc mappings', to_string=True)
base = min(int(line.split()[0], 16) for line in maps.splitlines() if 'qemu-vmsr-helper' in line)
gdb.execute('break *%d' % (base + 0x3a5ee))
end
continue
set $rbx = 0x756e6547
set $rdx = 0x49656e69
set $rcx = 0x6c65746e
delete
detach
quit
