// WebDataset tar shards as a Dataset: finding them (folders, brace patterns), indexing them (DALI index files or a header scan), reading samples with read-ahead, and each rank's streaming order.
#pragma once

#include "data/dataset.h"
#include "data/tar.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace convnets::data {

// A pattern expanding to more names than this is a typo, not a dataset.
constexpr std::size_t kMaxShards = 1'000'000;
// Samples shuffled together as a rank streams through its shards: DALI's
// webdataset reader fills 1,024 (initial_fill) by default as well.
constexpr std::size_t kShuffleBuffer = 1024;
// The class names beside the shards (one per line, class index = line).
constexpr const char* kClassesFile = "classes.txt";

// WebDataset's brace notation, as braceexpand reads it: {000000..000146}
// (zero-padded to the width written) and {a,b,c}, several per pattern.
// Throws Error naming the pattern for an unbalanced brace, an empty list or
// a range of more than kMaxShards names.
std::vector<std::string> expand_braces(const std::string& pattern);

// Whether a file name is a tar shard's: it ends in .tar, in any case (as image extensions are matched).
bool is_tar_name(const std::string& name);

// The shard files `location` names for `split` ("train" or "val"), or none:
// a .tar file; a brace pattern; a folder holding .tar files, of which
// SPLIT-*.tar when there are such (convnets pack's names), else all of them.
std::vector<std::string> find_shards(const std::string& location, const std::string& split);

// The key and the lower-cased extension of a member name, as WebDataset
// splits them: the key is the path up to the first '.' of the last path
// component, the extension what follows it ("a/b.seg.png" -> "a/b", "seg.png").
void split_member_name(const std::string& name, std::string& key, std::string& ext);

// A sample's label from its .cls/.txt (decimal text) or .json member (a number,
// or an object with "label", "cls" or "class"); nullopt with `why` set when it
// is none of those.
std::optional<std::int64_t> parse_label(const std::string& text, const std::string& ext, std::string& why);

// DALI's webdataset index (wds2idx): one line "v1.2 N", then per sample
// "ext offset size filename" for each of its members, offsets of the member
// data. Returns the members in file order; throws Error naming `path` for a
// malformed file, an unknown version or a member outside the `tar_size`-byte shard.
std::vector<tar::Member> read_dali_index(const std::string& text, const std::string& path, std::uint64_t tar_size);
std::string dali_index_text(const std::vector<std::vector<tar::Member>>& samples);

// The samples of `shards`: members grouped by key (consecutive, as WebDataset
// groups them), one image (.jpg/.jpeg/.png) and one label (.cls/.txt/.json)
// each. An index file SHARD.idx (DALI's format) is used when it is there and
// agrees with the shard's size, else the headers are scanned. Class names come
// from classes.txt beside the first shard, else are numbered up to the
// largest label. Samples without an image or label are skipped with one
// warning; a WebP or other undecoded image type is an Error naming the member.
DatasetPtr webdataset(const std::vector<std::string>& shards, const std::string& location);

}  // namespace convnets::data
