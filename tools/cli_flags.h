// What the subcommands' flag parsers (CLI11) share: the App each starts
// from, --help, parse errors as InvalidArgument, and value checks whose
// messages name the flag, the value and what it must be.
//
// A subcommand binds its flags to its options struct:
//   app.add_option("--page-size", o.page_size, "tokens per page")
//       ->type_name("P")->transform(flags::integer_in(1, 1 << 16));
// and --help lists them with the fields' initial values as "(default X)".
// Integer checks rewrite the value in decimal ("1e3" -> "1000") for CLI11 to
// convert, so they go in with ->transform(); the others with ->check().
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "pagedattn/dtype.h"

namespace pagedattn::tools::flags {

// The parser of `pagedattn NAME`. A repeated flag's last value wins;
// --help shows "usage: pagedattn NAME", the required flags, the description,
// each group of flags with its defaults, then the footer.
std::unique_ptr<CLI::App> make_app(const std::string& name, const std::string& description);

// Parses argv[first..argc) into the flags bound in `app`. Returns true when
// -h/--help was given (the caller prints app.help() and stops). Throws
// InvalidArgument "NAME: <flag> ..." on an unknown flag, a missing value or
// a value its check refuses.
bool parse(CLI::App& app, int argc, char** argv, int first);

// Value checks. A message follows the flag's name: "--turns = '0' must be an
// integer in [1, 65536]".
CLI::Validator integer_in(std::int64_t min, std::int64_t max);  // integer-valued: "16.0" is 16
CLI::Validator any_uint64();                                    // [0, 2^64), digits only
// A finite number in [min, max] (no upper bound by default).
CLI::Validator number_in(double min, double max = std::numeric_limits<double>::infinity());
CLI::Validator positive(double max = std::numeric_limits<double>::infinity());  // (0, max]
CLI::Validator non_empty();  // an empty key or name is a shell slip
CLI::Validator one_of(std::vector<std::string> allowed);

// A subcommand's own check: `check` returns "" for a good value, else the
// message, starting with value_is(value).
CLI::Validator value_check(std::function<std::string(std::string&)> check);
// "= 'VALUE' ": how a message about VALUE starts.
std::string value_is(const std::string& value);

// Flags of the subcommands that run a model, defined once for all of them.
void add_tensor_parallel_flag(CLI::App& app, std::int32_t& ranks);  // --tensor-parallel N
void add_bf16_products_flag(CLI::App& app, bool& allowed);          // --bf16-products
void add_exact_products_flag(CLI::App& app, bool& exact);           // --exact-products
void add_pin_threads_flag(CLI::App& app, bool& pin);                // --pin-threads
void add_kv_cache_dtype_flag(CLI::App& app, DType& dtype);          // --kv-cache-dtype T
void add_int8_activations_flag(CLI::App& app, bool& on);            // --int8-activations

}  // namespace pagedattn::tools::flags
