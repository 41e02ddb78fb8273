# Lets QEMU's own qemu-vmsr-helper start on a host that is not Intel, so the bench can measure it
# side by side with ours. Origin: the vmsr-helper team's measurement tools (the same script,
# copied so the bench stands alone). What it does: stops the helper right after the one CPUID
# instruction of its start-up vendor check, puts "GenuineIntel" in EBX/EDX/ECX, and detaches; from
# then on the helper runs untouched. The offset (0x3a5ee from the start of the mapped binary) is
# that of Debian's qemu-system-common 1:10.0.2+ds-2+deb13u1~bpo12+1 (bookworm-backports) only;
# bench/anchor.ts checks that version before using it. Another build needs its own offset.
# Usage: gdb -batch -x qemu-vmsr-helper-anyhost.gdb --args /usr/bin/qemu-vmsr-helper -k SOCK
set pagination off
set confirm off
starti
python
import gdb
m = gdb.execute('info proc mappings', to_string=True)
base = min(int(l.split()[0], 16) for l in m.splitlines() if 'qemu-vmsr-helper' in l)
gdb.execute('break *%d' % (base + 0x3a5ee))
end
continue
set $rbx = 0x756e6547
set $rdx = 0x49656e69
set $rcx = 0x6c65746e
delete
detach
quit
