# make_mid_build: a small C project built by `make -j4` (each compile waits
# a second first, so that a checkpoint falls mid-build: make, the shells of
# its recipes and their `sleep`s, a tree four processes deep); make's exit
# status is written to /root/proj/done once it ends.
mkdir -p /root/proj && cd /root/proj
for i in 1 2 3 4; do printf 'int f%d(void) { return %d; }\n' $i $i > f$i.c; done
printf '#include <stdio.h>\nint f1(void); int f2(void); int f3(void); int f4(void);\n' > main.c
printf 'int main(void) { printf("sum=%%d\\n", f1() + f2() + f3() + f4()); return 0; }\n' >> main.c
printf 'prog: main.o f1.o f2.o f3.o f4.o\n\tcc -o $@ $^\n%%.o: %%.c\n\tsleep 1 && cc -c $< -o $@\n' > Makefile
make -j4 > log 2>&1; echo $? > done
