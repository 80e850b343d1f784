# pulse-capdrop UID GID PROG ARG...: the program the Docker backend starts
# each command through (capdrop.go embeds its machine code). It empties
# the capability bounding set (PR_CAPBSET_DROP of 0 to 63; EINVAL, a
# number the kernel does not know, is no error), sets no supplementary
# groups, then GID, then UID, and execs PROG, a path, with ARG... and the
# environment it was given. Any failure writes one line to stderr and
# exits 126: the command never runs with what could not be dropped.
#
# Assemble with: as --64 -o capdrop.o capdrop_amd64.S
#   && objcopy -O binary --only-section=.text capdrop.o capdrop.bin
# (TestCapdropMatchesSource does, where as and objcopy exist.)
	.text
	.globl _start
_start:
	mov	(%rsp), %r12
	cmp	$4, %r12
	jl	fail
	xor	%ebx, %ebx
1:	mov	$157, %eax
	mov	$24, %edi
	mov	%rbx, %rsi
	xor	%edx, %edx
	xor	%r10d, %r10d
	xor	%r8d, %r8d
	syscall
	test	%rax, %rax
	jz	2f
	cmp	$-22, %rax
	jne	fail
2:	inc	%ebx
	cmp	$64, %ebx
	jb	1b
	mov	16(%rsp), %rdi
	call	atoi
	mov	%rax, %r13
	mov	24(%rsp), %rdi
	call	atoi
	mov	%rax, %r14
	mov	$116, %eax
	xor	%edi, %edi
	xor	%esi, %esi
	syscall
	test	%rax, %rax
	jnz	fail
	mov	$106, %eax
	mov	%r14, %rdi
	syscall
	test	%rax, %rax
	jnz	fail
	mov	$105, %eax
	mov	%r13, %rdi
	syscall
	test	%rax, %rax
	jnz	fail
	lea	32(%rsp), %rsi
	mov	(%rsi), %rdi
	lea	16(%rsp,%r12,8), %rdx
	mov	$59, %eax
	syscall
fail:
	mov	$1, %eax
	mov	$2, %edi
	lea	msg(%rip), %rsi
	mov	$msglen, %edx
	syscall
	mov	$60, %eax
	mov	$126, %edi
	syscall
# atoi: %rdi a NUL-terminated decimal of 1 to 9 digits; %rax its value.
# Anything else goes to fail (the stack is not unwound: fail exits).
atoi:
	xor	%eax, %eax
	xor	%ecx, %ecx
3:	movzbl	(%rdi,%rcx), %edx
	test	%edx, %edx
	jz	4f
	sub	$48, %edx
	cmp	$9, %edx
	ja	fail
	imul	$10, %eax, %eax
	add	%edx, %eax
	inc	%ecx
	cmp	$9, %ecx
	ja	fail
	jmp	3b
4:	test	%ecx, %ecx
	jz	fail
	ret
msg:	.ascii	"pulse-capdrop: cannot drop the capabilities or change uid/gid\n"
	.set	msglen, . - msg
