// GPT-2's pre-tokenization of a text by PCRE2's JIT and by tessera's splitter (tokenizer/pretokenize.cpp): MB/s of
// each, and whether they cut the text the same (see bench/results/2026-12-06-tokenizer-encode-cpu.md). PCRE2 is
// declared here, not included: Debian ships libpcre2-8 without its headers unless libpcre2-dev is installed.
//   g++ -O2 -std=c++20 -Isrc -o /tmp/pretokenize_pcre2 bench/micro/pretokenize_pcre2.cpp \
//       src/tessera/tokenizer/pretokenize.cpp src/tessera/tokenizer/unicode_classes.cpp src/tessera/core/file_io.cpp \
//       /usr/lib/x86_64-linux-gnu/libpcre2-8.so.0
//   /tmp/pretokenize_pcre2 TEXT_FILE      (its first 20 MB, cut back to whole UTF-8 characters)
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>
#include "tessera/core/file_io.h"
#include "tessera/tokenizer/pretokenize.h"
extern "C" {
struct pcre2_code_8;
struct pcre2_match_data_8;
pcre2_code_8* pcre2_compile_8(const uint8_t*, size_t, uint32_t, int*, size_t*, void*);
int pcre2_jit_compile_8(pcre2_code_8*, uint32_t);
pcre2_match_data_8* pcre2_match_data_create_from_pattern_8(const pcre2_code_8*, void*);
int pcre2_jit_match_8(const pcre2_code_8*, const uint8_t*, size_t, size_t, uint32_t, pcre2_match_data_8*, void*);
size_t* pcre2_get_ovector_pointer_8(pcre2_match_data_8*);
}
int main(int argc, char** argv) {
  std::string text = tessera::read_file_text(argv[1]);
  if (text.size() > 20000000) text.resize(20000000);
  while (text.size() && (uint8_t(text.back()) & 0xC0) == 0x80) text.pop_back();
  if (text.size() && uint8_t(text.back()) >= 0xC0) text.pop_back();
  const char* pat = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
  int err; size_t off;
  pcre2_code_8* re = pcre2_compile_8((const uint8_t*)pat, std::string(pat).size(), 0x00080000u | 0x00020000u, &err, &off, nullptr);
  if (!re || pcre2_jit_compile_8(re, 1) != 0) { std::printf("compile failed\n"); return 1; }
  pcre2_match_data_8* md = pcre2_match_data_create_from_pattern_8(re, nullptr);
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    size_t n1 = 0, at = 0;
    std::vector<size_t> a, b;
    while (at < text.size()) {
      int rc = pcre2_jit_match_8(re, (const uint8_t*)text.data(), text.size(), at, 0x40000000u, md, nullptr);
      if (rc < 0) { std::printf("no match at %zu\n", at); return 1; }
      size_t* ov = pcre2_get_ovector_pointer_8(md);
      if (ov[0] != at) { std::printf("gap at %zu\n", at); return 1; }
      a.push_back(ov[1] - ov[0]); at = ov[1]; ++n1;
    }
    auto t1 = std::chrono::steady_clock::now();
    std::string_view v(text);
    while (!v.empty()) { size_t l = tessera::gpt2_pretoken_length(v); b.push_back(l); v.remove_prefix(l); }
    auto t2 = std::chrono::steady_clock::now();
    double s1 = std::chrono::duration<double>(t1 - t0).count(), s2 = std::chrono::duration<double>(t2 - t1).count();
    std::printf("%.1f MB: pcre2-jit %.1f MB/s, tessera %.1f MB/s, same cuts: %s (%zu pre-tokens)\n", text.size() / 1e6,
                text.size() / 1e6 / s1, text.size() / 1e6 / s2, a == b ? "yes" : "NO", n1);
  }
}
