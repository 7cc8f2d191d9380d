#include "cli_flags.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <system_error>

#include "pagedattn/errors.h"

namespace pagedattn::tools::flags {
namespace {

constexpr std::size_t kHelpWidth = 80;      // columns of --help
constexpr std::size_t kMaxFlagColumn = 36;  // longer flags put their text on the next line

constexpr char kNoBreak = '\x1f';  // a space wrap() does not break at

// `text` in lines of at most `width` characters, broken between words; a
// '\n' in `text` starts a new line.
std::vector<std::string> wrap(const std::string& text, std::size_t width) {
  std::vector<std::string> lines;
  std::istringstream paragraphs(text);
  for (std::string paragraph; std::getline(paragraphs, paragraph);) {
    std::istringstream words(paragraph);
    std::string line;
    for (std::string word; words >> word;) {
      if (!line.empty() && line.size() + 1 + word.size() > width) {
        lines.push_back(line);
        line.clear();
      }
      line += (line.empty() ? "" : " ") + word;
    }
    lines.push_back(line);
  }
  for (std::string& line : lines) std::replace(line.begin(), line.end(), kNoBreak, ' ');
  return lines;
}

std::string wrapped(const std::string& text) {
  std::string out;
  for (const std::string& line : wrap(text, kHelpWidth)) out += line + "\n";
  return out;
}

bool takes_value(const CLI::Option& opt) {
  return opt.get_expected_max() != 0;
}

// "  -h, --help" or "  --page-size P": a flag's names and its value's label.
std::string flag_column(const CLI::Option& opt) {
  std::string names;
  for (const std::string& s : opt.get_snames()) names += (names.empty() ? "-" : ", -") + s;
  for (const std::string& l : opt.get_lnames()) names += (names.empty() ? "--" : ", --") + l;
  return "  " + names + (takes_value(opt) ? " " + opt.get_type_name() : "");
}

std::string description(const CLI::Option& opt) {
  std::string text = opt.get_description();
  if (opt.get_required()) return text + " (required)";
  if (takes_value(opt) && !opt.get_default_str().empty())
    text += std::string(" (default") + kNoBreak + opt.get_default_str() + ")";
  return text;
}

// The flag column, then the description wrapped beside it from `column` on
// (from the next line when the flag is too long).
std::string option_help(const CLI::Option& opt, std::size_t column) {
  std::string out = flag_column(opt);
  if (out.size() + 2 > column) out += '\n';
  for (const std::string& line : wrap(description(opt), kHelpWidth - column)) {
    const std::size_t filled = out.size() - (out.rfind('\n') + 1);  // npos + 1 == 0
    out.append(column - filled, ' ');
    out += line;
    out += '\n';
  }
  if (out.back() != '\n') out += '\n';
  return out;
}

std::string usage(const CLI::App& app) {
  std::string out = "usage: pagedattn " + app.get_name();
  for (const CLI::Option* opt :
       app.get_options([](const CLI::Option* o) { return o->get_required(); }))
    out += " " + opt->get_name() + " " + opt->get_type_name();
  return out + " [flags]\n";
}

std::string format_help(const CLI::App* app, const std::string&, CLI::AppFormatMode) {
  std::size_t column = 0;  // past the longest flag that fits
  for (const CLI::Option* opt : app->get_options())
    if (const std::size_t width = flag_column(*opt).size() + 2; width <= kMaxFlagColumn)
      column = std::max(column, width);
  std::string out = usage(*app) + wrapped(app->get_description());
  for (const std::string& group : app->get_groups()) {
    if (group.empty()) continue;  // hidden flags
    out += "\n" + group + ":\n";
    for (const CLI::Option* opt :
         app->get_options([&](const CLI::Option* o) { return o->get_group() == group; }))
      out += option_help(*opt, column);
  }
  if (!app->get_footer().empty()) out += "\n" + wrapped(app->get_footer());
  return out;
}

// The flag's name in CLI11's "FLAG: DETAIL" messages.
std::string flag_of(const std::string& what) {
  return what.substr(0, what.find(": "));
}

// CLI11's words for a refused value, "FLAG: DETAIL", where our checks write
// DETAIL to follow the flag's name.
std::string refused_value(const std::string& what) {
  const std::size_t colon = what.find(": ");
  return colon == std::string::npos ? what : flag_of(what) + " " + what.substr(colon + 2);
}

std::optional<double> finite_number(const std::string& text) {
  char* end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(x)) return std::nullopt;
  return x;
}

std::string shortest(double x) {
  char buffer[32];
  const auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, x);
  return std::string(buffer, end);
}

// A finite number above `min` (at least `min` unless `above_min`) and at most `max`.
CLI::Validator number_check(double min, bool above_min, double max) {
  return value_check([=](std::string& text) -> std::string {
    const std::optional<double> x = finite_number(text);
    if (!x) return value_is(text) + "is not a finite number";
    if ((above_min ? *x > min : *x >= min) && *x <= max) return "";
    if (std::isinf(max))
      return value_is(text) + "must be " + (above_min ? "> " : ">= ") + shortest(min);
    return value_is(text) + "must be a number in " + (above_min ? "(" : "[") + shortest(min) +
           ", " + shortest(max) + "]";
  });
}

}  // namespace

std::unique_ptr<CLI::App> make_app(const std::string& name, const std::string& description) {
  auto app = std::make_unique<CLI::App>(description, name);
  app->set_help_flag("-h,--help", "print this help and exit");
  app->allow_extras();  // parse() refuses them, in the project's words
  app->option_defaults()->always_capture_default()->multi_option_policy(
      CLI::MultiOptionPolicy::TakeLast);
  app->formatter_fn(format_help);
  return app;
}

bool parse(CLI::App& app, int argc, char** argv, int first) {
  std::vector<std::string> args;
  for (int i = argc - 1; i >= first; --i)
    args.emplace_back(argv[i]);  // CLI11 takes them last first
  auto refuse = [&](const std::string& message) {
    return InvalidArgument(detail::concat(app.get_name(), ": ", message));
  };
  try {
    app.parse(std::move(args));
  } catch (const CLI::CallForHelp&) {
    return true;
  } catch (const CLI::ValidationError& e) {
    throw refuse(refused_value(e.what()));
  } catch (const CLI::ArgumentMismatch& e) {  // "FLAG: 1 required TYPE missing"
    const std::string what = e.what();
    throw refuse(what.ends_with(" missing") ? flag_of(what) + " needs a value" : what);
  } catch (const CLI::ParseError& e) {
    throw refuse(e.what());
  }
  const std::vector<std::string> unknown = app.remaining();
  if (!unknown.empty()) throw refuse("unknown flag '" + unknown.front() + "' (see --help)");
  return false;
}

CLI::Validator value_check(std::function<std::string(std::string&)> check) {
  return CLI::Validator(std::move(check), /*validator_desc=*/"");
}

std::string value_is(const std::string& value) {
  return "= '" + value + "' ";
}

CLI::Validator integer_in(std::int64_t min, std::int64_t max) {
  return value_check([=](std::string& text) -> std::string {
    const std::optional<double> x = finite_number(text);
    if (!x || *x != std::floor(*x) || *x < double(min) || *x > double(max))
      return detail::concat(value_is(text), "must be an integer in [", min, ", ", max, "]");
    text = std::to_string(static_cast<std::int64_t>(*x));
    return "";
  });
}

CLI::Validator any_uint64() {
  return value_check([](std::string& text) -> std::string {
    std::uint64_t x = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), x);
    if (!text.empty() && error == std::errc() && end == text.data() + text.size()) return "";
    return value_is(text) + "must be an integer in [0, 2^64)";
  });
}

CLI::Validator number_in(double min, double max) {
  return number_check(min, /*above_min=*/false, max);
}

CLI::Validator positive(double max) {
  return number_check(0.0, /*above_min=*/true, max);
}

CLI::Validator non_empty() {
  return value_check(
      [](std::string& text) { return text.empty() ? "needs a non-empty value" : std::string(); });
}

CLI::Validator one_of(std::vector<std::string> allowed) {
  return value_check([allowed = std::move(allowed)](std::string& text) -> std::string {
    if (std::find(allowed.begin(), allowed.end(), text) != allowed.end()) return "";
    std::string list;
    for (std::size_t i = 0; i < allowed.size(); ++i)
      list += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + allowed[i];
    return value_is(text) + "must be " + list;
  });
}

void add_tensor_parallel_flag(CLI::App& app, std::int32_t& ranks) {
  app.add_option("--tensor-parallel", ranks, "split the model over N MPI ranks, under mpirun -np N")
      ->type_name("N")
      ->transform(integer_in(1, 1024));
}

void add_bf16_products_flag(CLI::App& app, bool& allowed) {
  app.add_flag("--bf16-products", allowed,
               "attention, and weight products of batches of more than 8 rows, on "
               "bf16 dot products where the CPU has AVX512-BF16 (faster, inputs rounded to "
               "bf16; default off)");
}

void add_exact_products_flag(CLI::App& app, bool& exact) {
  app.add_flag("--exact-products", exact,
               "f32 products in every step (default: where they measure faster on this CPU, "
               "prefill attention on bf16 products (queries, softmax weights and f16 K/V "
               "rounded to bf16), fp8 KV attention on bf16 or f16 products, whose rounding is "
               "below the fp8 values' own, and int8 activations in steps that decode 8 or more "
               "sequences (16 or 32 where timed so) and compute no prompt token, see "
               "--int8-activations)");
}

void add_pin_threads_flag(CLI::App& app, bool& pin) {
  app.add_flag("--pin-threads", pin,
               "bind the OpenMP threads, one each, to the CPUs the process may run on (for a "
               "machine or cpuset this process has to itself; default off)");
}

namespace {

// --kv-cache-dtype's names: vLLM's "fp8" (e4m3) and the short names
// bench-attention's --kv-dtype takes.
struct KvDtypeName {
  const char* name;
  DType dtype;
};
constexpr KvDtypeName kKvCacheDtypes[] = {
    {"f16", DType::kF16},     {"bf16", DType::kBF16},        {"f32", DType::kF32},
    {"fp8", DType::kFP8E4M3}, {"fp8_e4m3", DType::kFP8E4M3}, {"fp8_e5m2", DType::kFP8E5M2},
    {"int8", DType::kINT8},
};

}  // namespace

void add_kv_cache_dtype_flag(CLI::App& app, DType& dtype) {
  std::vector<std::string> names;
  for (const KvDtypeName& n : kKvCacheDtypes) names.emplace_back(n.name);
  app.add_option_function<std::string>(
         "--kv-cache-dtype",
         [&dtype](const std::string& name) {
           for (const KvDtypeName& n : kKvCacheDtypes)
             if (name == n.name) dtype = n.dtype;
         },
         "K/V storage: f16, bf16, f32, fp8 (= fp8_e4m3: half of f16's bytes per token, "
         "attention on bf16 products where they measure faster, see --exact-products), "
         "fp8_e5m2, int8 (per-token scales)")
      ->type_name("T")
      ->default_str("f16")
      ->check(one_of(names));
}

void add_int8_activations_flag(CLI::App& app, bool& on) {
  app.add_flag("--int8-activations", on,
               "quantised weights take activations rounded to int8 per 32 values, as llama.cpp, "
               "on integer dot products, in every step, prompts too (batches of more than 8 "
               "rows on the int8 tiles: AVX512-VNNI, AVX-VNNI or AVX2; faster decode and "
               "prefill; logits move, "
               "docs/models.md; default: only in steps that decode 8 or more sequences and "
               "compute no prompt token, see --exact-products)");
}

}  // namespace pagedattn::tools::flags
