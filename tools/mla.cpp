// tools/mla.cpp — the mla command line.
#include <cstdio>
int main() { std::puts("mla " MLA_VERSION); }
