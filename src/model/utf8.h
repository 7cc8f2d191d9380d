// UTF-8 decoding that never fails: an invalid or truncated sequence yields its
// first byte alone, flagged, so arbitrary bytes can be walked (and round-trip).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace pagedattn::utf8 {

struct CodePoint {
  char32_t value;       // the code point; the raw byte when !valid
  std::uint8_t length;  // bytes consumed: 1..4
  bool valid;
};

// The code point starting at text[pos] (pos < text.size()). Strict: no
// overlong forms, no surrogates, nothing above U+10FFFF.
inline CodePoint decode_at(std::string_view text, std::size_t pos) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(pos);
  if (lead < 0x80) return {lead, 1, true};
  int length = 0;
  char32_t value = 0;
  char32_t minimum = 0;
  if ((lead & 0xE0) == 0xC0) {
    length = 2, value = lead & 0x1F, minimum = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3, value = lead & 0x0F, minimum = 0x800;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4, value = lead & 0x07, minimum = 0x10000;
  } else {
    return {lead, 1, false};
  }
  if (pos + length > text.size()) return {lead, 1, false};
  for (int i = 1; i < length; ++i) {
    const unsigned char next = byte(pos + i);
    if ((next & 0xC0) != 0x80) return {lead, 1, false};
    value = (value << 6) | (next & 0x3F);
  }
  if (value < minimum || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) {
    return {lead, 1, false};
  }
  return {value, static_cast<std::uint8_t>(length), true};
}

inline void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Length of the longest prefix of `text` that ends on a character boundary
// and leaves out only a tail that could still become a valid sequence (the
// start of a multi-byte character whose continuation bytes have not come yet).
inline std::size_t complete_prefix_length(std::string_view text) {
  // A possibly incomplete sequence starts at most 3 bytes from the end.
  const std::size_t n = text.size();
  for (std::size_t back = 1; back <= 3 && back <= n; ++back) {
    const unsigned char c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    int need = 0;
    if ((c & 0xE0) == 0xC0)
      need = 2;
    else if ((c & 0xF0) == 0xE0)
      need = 3;
    else if ((c & 0xF8) == 0xF0)
      need = 4;
    if (need <= static_cast<int>(back)) return n;  // ASCII, or a sequence with all its bytes
    // Hold the tail back only if its bytes so far are a valid beginning.
    std::string padded(text.substr(n - back));
    const unsigned char continuation_fill[] = {0x80, 0x80, 0x80};
    while (static_cast<int>(padded.size()) < need) {
      // Smallest continuation that keeps the prefix valid (E0 needs A0.., F0 needs 90..,
      // ED stays below A0, F4 below 90).
      unsigned char fill = continuation_fill[0];
      if (padded.size() == 1) {
        if (c == 0xE0) fill = 0xA0;
        if (c == 0xF0) fill = 0x90;
      }
      padded += static_cast<char>(fill);
    }
    return decode_at(padded, 0).valid ? n - back : n;
  }
  return n;
}

}  // namespace pagedattn::utf8
