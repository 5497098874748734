// mla_decode_parts.h — the persistent see-saw grid's schedule (mla_decode_seesaw.cu): which KV
// tiles of which requests each part of the grid takes, and where the dispatch takes the grid. Plain
// C++ (relaxed constexpr on the device), so its test (test_decode_parts) runs in every build.
//
// The KV tiles (64 keys) of the requests, request after request, form one sequence of
// N = Σ_r ⌈k_len_r / 64⌉ positions, the same for every row tile. Part c of `parts` takes positions
// [⌊c·N/parts⌋, ⌊(c+1)·N/parts⌋): of each unit (request, row tile) it meets, the piece inside its
// range. A unit cut by part boundaries has its first tiles in one part (the head piece, that part's
// last piece) and the rest in later parts, where each piece is that part's first (a partial). A
// request without keys belongs to the part whose range holds its position, the last part for N.
#pragma once

namespace mla::cuda::mla_decode {

// Where the production dispatch (mla_fast_schedule) takes the persistent grid: the batch's key
// lengths uneven (a kv_fill, mla/batch.h, of at most kPersistentFillMax eighths) and its 64-row
// units between a quarter of the SMs and two waves of them. Measured on an H100 (bench/NOTES.md,
// "The persistent grid's dispatch"), h128 s_k 4096: at fill 5 and below it is 4–58 % faster than
// the unsplit or split grid at b32–b128 (the b32 fill-5 row even), at fill 6 1–9 % slower and on
// uniform batches 14–23 % slower; at b16 and below (≤ 32 units) 1.2–5× slower; past two waves
// mixed (b256 s_k 2048 ragged 3.5 % slower, b128 s_q 2 ragged 3 % faster). test_decode_parts holds
// the measured rows. (MlaDecodeTuning bit 128 forces the grid, 256 forbids it.)
constexpr int kPersistentFillMax = 5;
constexpr bool persistent_pays(int k_fill, long long units, int sms) {
  return k_fill <= kPersistentFillMax && 4 * units >= sms && units <= 2 * (long long)sms;
}

// Packed query rows (heads × s_q) of a batch's largest request up to which the dispatch takes the
// narrow swap-AB kernel (8/16/32-row tiles); past them, 64-row tiles (the see-saw kernels).
constexpr long long kNarrowRowsMax = 32;

// The launch class of an auto-dispatched decode (CudaOps::launch_class, a step graph's key): 1
// where mla_fast_schedule takes the persistent grid for `requests` requests whose largest holds
// `max_rows` packed query rows, at kv_fill `k_fill` on `sms` SMs; else 0. Only the 64-row kernels
// follow the fill, so a narrow batch (16 heads at s_q ≤ 2) is class 0 at every fill.
constexpr int persistent_class(long long max_rows, long long requests, int k_fill, int sms) {
  if (max_rows <= kNarrowRowsMax) return 0;
  return persistent_pays(k_fill, requests * ((max_rows + 63) / 64), sms) ? 1 : 0;
}

// KV tiles of a request of k_len keys.
constexpr long long parts_tiles(int k_len) { return ((k_len > 0 ? k_len : 0) + 63) / 64; }

// The first position of part `part` of `parts` over n positions (part = parts: n).
constexpr long long part_begin(long long n, int part, int parts) { return n * part / parts; }

// Whether a part whose range starts at a has reached the request at position pos of `tiles` tiles:
// false for every request before the part's first, true from it on (positions only grow).
constexpr bool part_reached(long long pos, long long tiles, long long a) {
  return pos + tiles > a || (tiles == 0 && pos == a);
}

// Whether the request at pos lies past the part's range [a, b) (the walk ends there).
constexpr bool part_passed(long long pos, long long tiles, long long b, bool last_part) {
  return tiles > 0 ? pos >= b : pos > b || (pos == b && !last_part);
}

enum class PieceKind { kWhole, kHead, kPartial };
struct DecodePiece {
  int t_begin, t_end;  // the unit's KV tiles the part takes
  PieceKind kind;
};
// The part [a, b)'s piece of a request at pos of `tiles` tiles that it reached and did not pass.
constexpr DecodePiece part_piece(long long pos, long long tiles, long long a, long long b) {
  const long long lo = a > pos ? a : pos, hi = b < pos + tiles ? b : pos + tiles;
  const int t_begin = int(lo - pos), t_end = int(hi - pos);
  return {t_begin, t_end, t_begin > 0 ? PieceKind::kPartial : t_end < tiles ? PieceKind::kHead : PieceKind::kWhole};
}

// How many parts after `part` hold pieces of the unit ending at position unit_end (its head's
// partials to merge: those parts' CTAs of the same row tile).
constexpr int parts_after(long long n, int part, int parts, long long unit_end) {
  int count = 0;
  while (part + 1 + count < parts && part_begin(n, part + 1 + count, parts) < unit_end) ++count;
  return count;
}

}  // namespace mla::cuda::mla_decode
