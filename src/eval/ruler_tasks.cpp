// RULER-style task generation: seeded facts placed at seeded depths inside seeded
// filler, the filler count fitted to the token budget with a few token_count calls.
// All word lists and templates here are our own.
#include "eval/ruler_tasks.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <numeric>
#include <set>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "core/error.h"

namespace dhs::eval {
namespace {

// ---- randomness ------------------------------------------------------------------
// splitmix64: a few lines, fully specified, so samples are identical across standard
// libraries (std::uniform_int_distribution's output is implementation-defined).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n): rejects the 2^64 mod n lowest draws so `r % n` is unbiased.
  uint64_t below(uint64_t n) {
    DHS_ASSERT(n > 0);
    const uint64_t threshold = (0 - n) % n;
    for (;;)
      if (const uint64_t r = next(); r >= threshold) return r % n;
  }
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)

 private:
  uint64_t state_;
};

// Independent stream per (seed, purpose, index): filler sentence i must not depend on
// how many sentences the length search asked for, so nothing is drawn sequentially
// across the filler.
uint64_t mix(uint64_t a, uint64_t b) {
  Rng r(a ^ (b * 0xD6E8FEB86659FD93ull));
  r.next();
  return r.next();
}

enum Salt : uint64_t { kSaltFacts = 1, kSaltFiller, kSaltBreak, kSaltCwe, kSaltShuffle, kSaltPseudo };

using Words = std::vector<std::string_view>;

template <class T> const T& pick(Rng& rng, const std::vector<T>& v) { return v[rng.below(v.size())]; }

// k distinct indices out of [0, n), in random order (partial Fisher-Yates).
std::vector<size_t> pick_distinct(Rng& rng, size_t n, size_t k) {
  DHS_ASSERT(k <= n);
  std::vector<size_t> idx(n);
  std::iota(idx.begin(), idx.end(), size_t{0});
  for (size_t i = 0; i < k; ++i) std::swap(idx[i], idx[i + rng.below(n - i)]);
  idx.resize(k);
  return idx;
}

// k distinct decimal numbers in [low, 10 * low): all of one length, no leading zero.
std::vector<std::string> distinct_numbers(Rng& rng, uint64_t low, size_t k) {
  std::set<uint64_t> seen;
  std::vector<std::string> out;
  while (out.size() < k) {
    const uint64_t v = low + rng.below(9 * low);
    if (seen.insert(v).second) out.push_back(std::to_string(v));
  }
  return out;
}

// ---- word lists --------------------------------------------------------------------
// Fact vocabulary (keys, people, towns) is disjoint from the filler vocabulary, and the
// filler has no digits and none of "special", "magic", "number", "born", "town",
// "variable", "value", so a fact can only be found where it was inserted.
const Words kKeyAdj = {"amber", "brave", "clever", "crimson", "eager", "fancy", "fuzzy", "humble",
                       "jolly", "lively", "lucky", "mellow", "noble", "rapid", "swift", "tidy",
                       "vivid", "witty", "zesty", "cosmic", "frosty", "jagged", "lunar", "plucky",
                       "quirky", "royal", "sturdy", "dapper", "nimble", "spicy", "glossy", "snowy"};
const Words kKeyNoun = {"falcon", "lantern", "compass", "walnut", "violin", "harbor", "comet", "dragon",
                        "pebble", "kettle", "otter", "beacon", "anchor", "thimble", "badger", "saddle",
                        "parrot", "marble", "ribbon", "pepper", "cactus", "canyon", "tulip", "hammock",
                        "puzzle", "rocket", "sparrow", "tiger", "velvet", "whistle", "zephyr", "button"};
const Words kFirstNames = {"Alaric", "Benedetta", "Corvin", "Delphine", "Evander", "Fenna", "Galen",
                           "Hesper", "Ingram", "Juniper", "Kasimir", "Lisbet", "Marek", "Nerissa",
                           "Osric", "Perpetua", "Quillon", "Rosalind", "Severin", "Tamsin", "Ulric",
                           "Verity", "Wendeline", "Yorick", "Zinnia", "Anselm", "Briony", "Cosima"};
const Words kLastNames = {"Ashcombe", "Blackthorn", "Calloway", "Darrowby", "Eldridge", "Fennimore",
                          "Gallowglass", "Hargreave", "Islington", "Jessop", "Kilbride", "Lockhart",
                          "Merriweather", "Nettlefold", "Ormsby", "Pemberton", "Quenby", "Rookwood",
                          "Sallow", "Tregarthen", "Underwood", "Vantongeren", "Whitlock", "Yelverton"};
const Words kTowns = {"Bramblewick", "Cinderford", "Dunmarrow", "Eastholme", "Fallowmere", "Greyhaven",
                      "Hollowbrook", "Ivybridge", "Larkspur", "Millbarrow", "Northwold", "Oakhollow",
                      "Pennystone", "Quarrymoor", "Ravensholt", "Saltmarsh", "Thornbury", "Underhill",
                      "Wickmere", "Yarrowby", "Zennor", "Aldermoor", "Blythedale", "Coldharbour"};

// Filler slots: {name} in a template draws one entry of the list with that name.
struct Slot {
  std::string_view name;
  Words words;
};
const std::vector<Slot> kSlots = {
    {"adj", {"old", "narrow", "grey", "wooden", "crooked", "broad", "mossy", "pale", "dusty", "heavy",
             "weathered", "tall", "low", "shaded", "muddy", "steep", "bright", "damp", "worn", "cold",
             "warm", "small", "long", "distant", "busy", "sleepy", "rusty", "painted", "empty", "sunlit"}},
    {"noun", {"cart", "bridge", "mill", "fence", "barn", "well", "gate", "path", "wall", "roof", "boat",
              "net", "basket", "bell", "cottage", "chimney", "ladder", "stable", "wagon", "granary",
              "footbridge", "hedge", "cellar", "porch", "loom", "cask", "jetty", "dovecote"}},
    {"place", {"valley", "hillside", "riverbank", "market square", "pasture", "crossroads", "meadow",
               "marsh", "ridge", "woodland", "estuary", "lowlands", "upper fields", "ferry landing",
               "village green", "old quarter"}},
    {"role", {"miller", "ferryman", "weaver", "shepherd", "baker", "gardener", "merchant", "fisherman",
              "potter", "carpenter", "innkeeper", "blacksmith", "beekeeper", "tanner", "cooper",
              "schoolteacher", "boatwright", "herbalist", "toll keeper", "chandler", "thatcher"}},
    {"verb_i", {"creaked", "settled", "leaned", "faded", "stood", "rested", "waited", "sagged",
                "glistened", "dried", "cooled", "darkened", "echoed", "swayed", "shone"}},
    {"verb_t", {"repaired", "painted", "swept", "inspected", "mended", "cleaned", "guarded", "sold",
                "loaded", "unloaded", "measured", "admired", "visited", "locked", "patched"}},
    {"time", {"at dawn", "before noon", "in the late afternoon", "after the evening meal", "at dusk",
              "through the night", "early in the morning", "after the first frost", "during the long rains",
              "at the turn of the season", "on market day", "when the bells rang", "before the rain"}},
    {"season", {"spring", "summer", "autumn", "winter", "harvest time", "planting season", "rainy season",
                "dry season"}},
    {"adj2", {"wet", "dry", "mild", "harsh", "windy", "bitter", "pleasant", "stormy", "gloomy", "generous",
              "strange", "short", "long", "muddy", "dusty", "bright"}},
    {"weather", {"rain", "fog", "mist", "wind", "snow", "hail", "drizzle", "thunder", "frost", "storm",
                 "heat", "dew", "sleet", "cloud"}},
    {"weather_verb", {"clear", "return", "settle in", "pass", "break", "linger", "ease", "drift inland",
                      "lift", "grow worse"}},
    {"time_end", {"nightfall", "the harvest", "the next market", "the week was out", "the moon was full",
                  "the geese flew south", "the river froze", "the fair began"}},
    {"river_part", {"riverbank", "towpath", "shallows", "old ford", "water meadows", "mill race",
                    "far shore", "weir", "reed beds"}},
    {"creatures", {"herons", "ducks", "swallows", "frogs", "geese", "cattle", "goats", "children",
                   "beetles", "moths", "sheep", "trout", "eels", "crows", "bees", "wrens", "hares"}},
    {"verb_pl", {"gather", "wander", "rest", "feed", "linger", "splash", "sing", "drift", "chatter",
                 "nest", "graze", "play"}},
    {"adverb", {"slowly", "quietly", "happily", "carefully", "lazily", "steadily", "briefly", "patiently",
                "noisily", "softly", "cheerfully", "calmly"}},
    {"goods", {"wool", "salt", "barley", "cheese", "timber", "linen", "honey", "rope", "cloth", "leather",
               "wine", "olive oil", "dried fish", "flour", "spices", "copper pots", "candles", "apples",
               "pottery", "iron nails", "oats", "dyes"}},
    {"direction", {"north", "south", "east", "west", "coast", "hills", "far valleys", "mountain passes",
                   "islands"}},
    {"market", {"market", "fair", "quayside", "guild hall", "crossroads inn", "river market", "docks"}},
    {"garden_part", {"kitchen garden", "herb garden", "walled garden", "orchard", "greenhouse",
                     "vegetable patch", "flower border", "courtyard"}},
    {"plant", {"beans", "roses", "lavender bushes", "cabbages", "hawthorns", "onions", "sunflowers",
               "poppies", "pear trees", "marigolds", "leeks", "hollyhocks", "ferns", "nettles", "foxgloves"}},
    {"structure", {"wall", "shed", "well", "trellis", "gate", "fountain", "sundial", "wheelbarrow",
                   "fence", "bench", "pond", "arch"}},
    {"landform", {"hills", "valley", "moor", "marsh", "plain", "ridge", "lake", "bay", "fields", "woods",
                  "downs", "estuary", "heath"}},
    {"verb_w", {"rolled", "drifted", "swept", "gathered", "lingered", "settled", "hung", "crept", "blew",
                "moved"}},
    {"role_act", {"went home early", "closed the shutters", "lit the stove", "sang an old song",
                  "fed the animals", "sat by the fire", "mended a sleeve", "wrote a letter",
                  "counted the coins", "sharpened the tools", "swept the floor", "told a long story"}},
    {"verb_plant", {"grow", "bloom", "thrive", "spread", "flourish", "wither"}},
};

const std::vector<std::string_view> kTemplates = {
    "The {adj} {noun} by the {place} {verb_i} {time}.",
    "{time}, the {role} {verb_t} the {adj} {noun}.",
    "Nobody in the {place} could recall a {season} as {adj2} as this one.",
    "The {role} was sure the {weather} would {weather_verb} before {time_end}.",
    "Along the {river_part}, {creatures} {verb_pl} {adverb} {time}.",
    "Traders from the {direction} brought {goods} and {goods} to the {market}.",
    "In the {garden_part}, the {plant} grew {adverb} beside the {adj} {structure}.",
    "The {weather} {verb_w} {adverb} over the {landform}, and the {role} {role_act}.",
    "Old stories say that {creatures} only {verb_pl} where the {plant} {verb_plant}.",
    "Every {season} the river rises, and the {role} moves the {goods} to higher ground.",
    "The price of {goods} at the {market} rose again, which made the {role} grumble.",
    "A {adj} {noun} stood at the edge of the {place}, half hidden by {plant}.",
    "When the {weather} came, the {role} and the {role} {role_act}.",
    "The {role} kept {goods} in the {adj} {noun} behind the {structure}.",
    "Few people crossed the {landform} in {season}, for the paths were {adj2} and {adj2}.",
    "Long before {time_end} the {garden_part} was full of {plant} and {creatures}.",
    "The {role} {verb_t} the {noun} {time}, then {role_act}.",
    "Some said the {weather} over the {landform} was the worst since the {adj} {noun} was built.",
};

const Words& slot_words(std::string_view name) {
  for (const Slot& s : kSlots)
    if (s.name == name) return s.words;
  throw Error(fmt::format("internal error: filler template slot '{}' has no word list", name));
}

// Filler sentence i of a sample: a template with its slots drawn from sentence i's own
// stream. A slot repeated in one sentence ("the {role} and the {role}") gets distinct words.
std::string filler_sentence(uint64_t seed, int64_t i) {
  Rng rng(mix(mix(seed, kSaltFiller), static_cast<uint64_t>(i)));
  const std::string_view tpl = pick(rng, kTemplates);
  std::string out;
  std::vector<std::pair<std::string_view, std::string_view>> drawn;
  for (size_t p = 0; p < tpl.size();) {
    if (tpl[p] != '{') {
      out += tpl[p++];
      continue;
    }
    const size_t close = tpl.find('}', p);
    DHS_ASSERT(close != std::string_view::npos);
    const std::string_view name = tpl.substr(p + 1, close - p - 1);
    const Words& words = slot_words(name);
    std::string_view w = pick(rng, words);
    auto seen = [&](const auto& d) { return d.first == name && d.second == w; };
    while (std::any_of(drawn.begin(), drawn.end(), seen)) w = pick(rng, words);
    drawn.emplace_back(name, w);
    out += w;
    p = close + 1;
  }
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = static_cast<char>(out[0] - 'a' + 'A');
  return out;
}

// ---- haystack ------------------------------------------------------------------------
struct Fact {
  double depth;  // [0, 1): fraction of the filler sentences that come before it
  std::string text;
};

// A document of `n` filler sentences with facts between sentences (never inside one).
// Filler sentences are cached: the length search renders the same prefix many times.
class Haystack {
 public:
  Haystack(uint64_t seed, std::string header, std::vector<Fact> facts)
      : seed_(seed), header_(std::move(header)), facts_(std::move(facts)) {
    // Stable: facts with equal depth keep the order given (a variable chain stays in order).
    std::stable_sort(facts_.begin(), facts_.end(), [](const Fact& a, const Fact& b) { return a.depth < b.depth; });
  }

  std::string render(int64_t n) {
    while (static_cast<int64_t>(sentences_.size()) < n)
      sentences_.push_back(filler_sentence(seed_, static_cast<int64_t>(sentences_.size())));
    std::string out = header_;
    auto append = [&](const std::string& s, bool paragraph_break) {
      if (out.size() > header_.size()) out += paragraph_break ? "\n\n" : " ";
      out += s;
    };
    size_t f = 0;
    for (int64_t i = 0; i <= n; ++i) {
      // Facts whose slot is i go before sentence i (slot n: after the last one).
      while (f < facts_.size() && slot(facts_[f], n) <= i) append(facts_[f++].text, false);
      if (i == n) break;
      // Paragraph breaks depend on the sentence index only, like the sentences.
      append(sentences_[i], i > 0 && mix(mix(seed_, kSaltBreak), static_cast<uint64_t>(i)) % 5 == 0);
    }
    out += "\n\n";
    return out;
  }

 private:
  static int64_t slot(const Fact& fact, int64_t n) { return std::llround(fact.depth * static_cast<double>(n)); }

  uint64_t seed_;
  std::string header_;
  std::vector<Fact> facts_;
  std::vector<std::string> sentences_;
};

// ---- length fitting --------------------------------------------------------------------
constexpr double kFitLow = 0.97;   // accept a length in [kFitLow * target, target]
constexpr double kFitAim = 0.985;  // interpolation aims at the middle of that window
constexpr int kInterpolationSteps = 4;  // then bisection, so the call count stays O(log n)

// Largest-feasible count n for a length that grows (near-linearly) with n: returns an n
// whose measured length is <= target, within the window when one step allows it.
// `guess_per_unit` only sizes the first probe; the rest is measured.
int64_t fit_count(const std::function<int64_t(int64_t)>& measure, int64_t target, double guess_per_unit,
                  const std::string& what) {
  const int64_t t0 = measure(0);
  DHS_CHECK(t0 <= target, "{}: target of {} tokens is too small (the task text alone is {} tokens)", what,
            target, t0);
  const double goal_lo = kFitLow * static_cast<double>(target);
  const double aim = kFitAim * static_cast<double>(target);
  if (static_cast<double>(t0) >= goal_lo) return 0;
  int64_t lo = 0, t_lo = t0;  // largest count known to fit
  int64_t hi = -1, t_hi = 0;  // smallest count known not to fit (-1: none yet)
  int64_t n = std::max<int64_t>(1, static_cast<int64_t>((aim - static_cast<double>(t0)) / guess_per_unit));
  for (int step = 0; step < 200; ++step) {
    const int64_t t = measure(n);
    if (t <= target) {
      lo = n, t_lo = t;
      if (static_cast<double>(t) >= goal_lo) return n;
    } else {
      hi = n, t_hi = t;
    }
    if (hi >= 0 && hi - lo <= 1) return lo;
    if (step < kInterpolationSteps) {
      // Secant through the bracket (or through (0, t0) and lo while nothing overshot).
      const double per = hi >= 0 ? static_cast<double>(t_hi - t_lo) / static_cast<double>(hi - lo)
                                 : static_cast<double>(t_lo - t0) / static_cast<double>(std::max<int64_t>(lo, 1));
      n = lo + static_cast<int64_t>(std::floor((aim - static_cast<double>(t_lo)) / std::max(per, 1e-6)));
    } else {
      n = hi >= 0 ? lo + (hi - lo) / 2 : 2 * lo + 1;
    }
    // Stay inside the bracket; with no overshoot yet, grow at most 8x per step so a
    // bad secant (two counts that happened to tokenize alike) cannot render a huge text.
    n = std::clamp(n, lo + 1, hi >= 0 ? hi - 1 : 8 * lo + 64);
  }
  return lo;
}

// ---- tasks ------------------------------------------------------------------------------
constexpr double kTokensPerSentence = 20;  // first-probe guesses only (fit_count measures)
constexpr double kTokensPerCweWord = 10;   // one uncommon word is ~2 entries "123. word\n"
constexpr int kAnswerSlack = 16;           // separators, "and", a closing period
constexpr size_t kNumCommon = 5;

// What a haystack task puts around the filler.
struct Spec {
  std::string header;
  std::vector<Fact> facts;
  std::string question, answer_prefix;
  std::vector<std::string> answers;
};

std::string needle(const std::string& key, const std::string& number) {
  return "The special magic number for " + key + " is " + number + ".";
}

Spec niah_spec(TaskKind task, Rng& rng) {
  const size_t n_keys = task == TaskKind::NiahSingle || task == TaskKind::NiahMultiValue ? 1 : 4;
  const size_t n_needles = task == TaskKind::NiahSingle ? 1 : 4;
  // Distinct adjectives and nouns, so no key is a near-copy of a distractor.
  const std::vector<size_t> adj = pick_distinct(rng, kKeyAdj.size(), n_keys);
  const std::vector<size_t> noun = pick_distinct(rng, kKeyNoun.size(), n_keys);
  std::vector<std::string> keys;
  for (size_t k = 0; k < n_keys; ++k)
    keys.push_back(std::string(kKeyAdj[adj[k]]) + "-" + std::string(kKeyNoun[noun[k]]));
  const std::vector<std::string> numbers = distinct_numbers(rng, 1000000, n_needles);

  Spec s;
  s.header = "Hidden in the passage below are some special magic numbers. Read it closely, since you "
             "will be asked about them at the end.\n\n";
  for (size_t i = 0; i < n_needles; ++i) s.facts.push_back({rng.unit(), needle(keys[i % n_keys], numbers[i])});
  if (task == TaskKind::NiahMultiValue) {
    s.question = "What are all the special magic numbers for " + keys[0] +
                 " mentioned in the passage above? List every one of them.";
    s.answer_prefix = "The special magic numbers for " + keys[0] + " are";
    s.answers = numbers;
  } else if (task == TaskKind::NiahMultiQuery) {
    const std::vector<size_t> ask = pick_distinct(rng, n_keys, 2);
    const std::string both = keys[ask[0]] + " and " + keys[ask[1]];
    s.question = "What are the special magic numbers for " + both + " mentioned in the passage above?";
    s.answer_prefix = "The special magic numbers for " + both + " are";
    s.answers = {numbers[ask[0]], numbers[ask[1]]};
  } else {
    const size_t ask = rng.below(n_keys);
    s.question = "What is the special magic number for " + keys[ask] + " mentioned in the passage above?";
    s.answer_prefix = "The special magic number for " + keys[ask] + " is";
    s.answers = {numbers[ask]};
  }
  return s;
}

// Two chains of five variables (one value assignment, four hops), the second a
// distractor with another value. Each chain's statements appear in chain order.
Spec vt_spec(Rng& rng) {
  constexpr int kChainLen = 5;
  const std::vector<std::string> values = distinct_numbers(rng, 10000, 2);
  std::set<std::string> used;
  std::vector<std::vector<std::string>> chains(2);
  for (auto& chain : chains)
    while (static_cast<int>(chain.size()) < kChainLen) {
      std::string name(5, 'A');
      for (char& c : name) c = static_cast<char>('A' + rng.below(26));
      if (used.insert(name).second) chain.push_back(name);
    }
  Spec s;
  s.header = "The passage below contains a few variable assignments scattered among ordinary sentences. "
             "Follow them carefully.\n\n";
  for (size_t c = 0; c < chains.size(); ++c) {
    std::vector<double> depth(kChainLen);
    for (double& d : depth) d = rng.unit();
    std::sort(depth.begin(), depth.end());
    for (int k = 0; k < kChainLen; ++k) {
      const std::string rhs = k == 0 ? values[c] : "VAR " + chains[c][k - 1];
      s.facts.push_back({depth[k], "VAR " + chains[c][k] + " = " + rhs + "."});
    }
  }
  s.question = "Which variables in the passage above are assigned the value " + values[0] +
               ", either directly or through other variables? Name all of them.";
  s.answer_prefix = "The variables assigned the value " + values[0] + " are:";
  s.answers = chains[0];
  return s;
}

// One asked birthplace among ten distractors; people and towns all distinct.
Spec qa_spec(Rng& rng) {
  constexpr size_t kFacts = 11;
  const std::vector<size_t> first = pick_distinct(rng, kFirstNames.size(), kFacts);
  const std::vector<size_t> last = pick_distinct(rng, kLastNames.size(), kFacts);
  const std::vector<size_t> town = pick_distinct(rng, kTowns.size(), kFacts);
  Spec s;
  s.header = "The passage below records, among other things, the birthplaces of several people.\n\n";
  std::vector<std::string> people;
  for (size_t i = 0; i < kFacts; ++i) {
    people.push_back(std::string(kFirstNames[first[i]]) + " " + std::string(kLastNames[last[i]]));
    s.facts.push_back({rng.unit(), people[i] + " was born in the town of " + std::string(kTowns[town[i]]) + "."});
  }
  s.question = "In which town was " + people[0] + " born?";
  s.answer_prefix = people[0] + " was born in the town of";
  s.answers = {std::string(kTowns[town[0]])};
  return s;
}

// Real words for cwe (lowercase letters only); pseudo-words extend the pool when a long
// list needs more distinct uncommon words than this.
const Words kCweWords = {
    "apple", "bread", "chair", "dance", "eagle", "fable", "grape", "house", "igloo", "jelly", "kite",
    "lemon", "mango", "nurse", "ocean", "piano", "queen", "river", "stone", "table", "uncle", "vase",
    "whale", "yacht", "zebra", "acorn", "blanket", "candle", "desert", "engine", "forest", "garlic",
    "helmet", "island", "jacket", "kitten", "ladder", "mirror", "needle", "orange", "pencil", "rabbit",
    "salmon", "tomato", "umbrella", "valley", "window", "yogurt", "basket", "bottle", "bucket", "butter",
    "carpet", "castle", "cherry", "circus", "cookie", "copper", "cotton", "dinner", "doctor", "donkey",
    "drawer", "feather", "finger", "flower", "garden", "ginger", "glove", "guitar", "hammer", "honey",
    "insect", "jungle", "kernel", "lizard", "magnet", "meadow", "monkey", "muffin", "napkin", "nickel",
    "noodle", "oyster", "paddle", "parcel", "pillow", "planet", "pocket", "potato", "puppet", "quilt",
    "radish", "rocket", "saddle", "shovel", "silver", "spider", "spoon", "statue", "sugar", "tailor",
    "teapot", "ticket", "tunnel", "turkey", "velvet", "violet", "wagon", "walrus", "wizard", "wrench",
    "anchor", "badge", "barrel", "beetle", "blossom", "bridge", "broom", "cabin", "camel", "canoe",
    "cereal", "cobweb", "crayon", "crown", "daisy", "dolphin", "dragon", "falcon", "fossil", "goblet",
    "gravel", "harbor", "jigsaw", "kettle", "lantern", "locket", "marble", "mitten", "orchid", "pebble",
    "pepper", "pirate", "powder", "pumpkin", "quiver", "raisin", "ribbon", "sandal", "scarf", "sleigh",
    "spinach", "sponge", "squash", "thimble", "thistle", "trumpet", "tulip", "turnip", "waffle", "walnut",
    "weasel", "whistle", "willow", "anvil", "banjo", "beaver", "bonnet", "cactus", "cannon", "chisel",
    "clover", "compass", "cradle", "dagger", "easel", "emerald", "ferret", "fiddle", "goose", "hornet",
    "jasmine", "juggler", "koala", "lobster", "mammoth", "melon", "mustard", "nectar", "otter", "panda",
    "parrot", "peacock", "pelican", "penguin", "pickle", "plum", "pretzel", "python", "quartz", "raven",
    "rhubarb", "saffron", "sardine", "scooter", "sequin", "shrimp", "sparrow", "squirrel", "tadpole",
    "toffee", "trolley", "tuxedo", "vulture", "wombat", "almond", "beacon", "biscuit", "buckle",
    "cinnamon", "cupcake", "dumpling", "fountain", "gazelle", "hedgehog", "iceberg", "lagoon", "mosaic",
    "nutmeg", "pancake", "quarry", "satchel", "teacup", "vanilla", "wardrobe", "zipper",
};

// The cwe list: kNumCommon common words repeated common_repeats(u) times and u uncommon
// words 1-3 times each, shuffled and numbered; u is what the length search varies.
class WordList {
 public:
  explicit WordList(uint64_t seed) : seed_(seed) {
    Rng rng(mix(seed, kSaltCwe));
    const std::vector<size_t> perm = pick_distinct(rng, kCweWords.size(), kCweWords.size());
    // A common word inside another word ("plum" in "plumber") would make scoring by
    // substring credit the wrong word, so commons are never part of another word.
    std::vector<std::string> rest;
    for (size_t p : perm) {
      const std::string w(kCweWords[p]);
      const bool inside = std::any_of(kCweWords.begin(), kCweWords.end(),
                                      [&](std::string_view o) { return o != w && o.find(w) != o.npos; });
      (common_.size() < kNumCommon && !inside ? common_ : rest).push_back(w);
    }
    DHS_ASSERT(common_.size() == kNumCommon);
    pool_ = common_;
    pool_.insert(pool_.end(), rest.begin(), rest.end());
    used_.insert(pool_.begin(), pool_.end());
  }

  // Fewer repeats in short lists so the commons do not crowd out everything else;
  // never fewer than 6, so they stay strictly above the uncommons' 3.
  static int64_t common_repeats(int64_t u) { return std::clamp<int64_t>(u / 4, 6, 30); }
  const std::vector<std::string>& common() const { return common_; }

  std::string render(int64_t u) {
    grow_pool(kNumCommon + static_cast<size_t>(u));
    std::vector<uint32_t> entries;
    for (uint32_t c = 0; c < kNumCommon; ++c) entries.insert(entries.end(), common_repeats(u), c);
    for (int64_t j = 0; j < u; ++j) {
      Rng r(mix(mix(seed_, kSaltCwe), static_cast<uint64_t>(j)));
      entries.insert(entries.end(), 1 + r.below(3), static_cast<uint32_t>(kNumCommon + j));
    }
    Rng rng(mix(seed_, kSaltShuffle));
    for (size_t i = entries.size(); i > 1; --i) std::swap(entries[i - 1], entries[rng.below(i)]);
    std::string out = "Below is a numbered list of words. Some words are repeated many times, others only "
                      "once or a few times.\n\n";
    for (size_t k = 0; k < entries.size(); ++k) out += fmt::format("{}. {}\n", k + 1, pool_[entries[k]]);
    out += "\n";
    return out;
  }

 private:
  // Pronounceable pseudo-words ("brailom", "stoker") from syllables: never a repeat, and
  // never containing a common word, for the same reason as above.
  void grow_pool(size_t n) {
    static const Words kOnset = {"b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v",
                                 "z", "br", "dr", "gl", "pr", "sk", "st", "tr", "ch", "sh"};
    static const Words kVowel = {"a", "e", "i", "o", "u", "ai", "ea", "oo"};
    static const Words kCoda = {"", "", "n", "r", "l", "s", "m", "k", "nd", "st"};
    while (pool_.size() < n) {
      Rng r(mix(mix(seed_, kSaltPseudo), n_pseudo_++));
      std::string w;
      for (uint64_t s = 0, n_syl = 2 + r.below(2); s < n_syl; ++s)
        w += std::string(pick(r, kOnset)) + std::string(pick(r, kVowel)) + std::string(pick(r, kCoda));
      const bool has_common =
          std::any_of(common_.begin(), common_.end(), [&](const std::string& c) { return w.find(c) != w.npos; });
      if (!has_common && used_.insert(w).second) pool_.push_back(std::move(w));
    }
  }

  uint64_t seed_;
  std::vector<std::string> common_, pool_;
  std::unordered_set<std::string> used_;
  uint64_t n_pseudo_ = 0;
};

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? std::string(sep) : "") + parts[i];
  return out;
}

std::string lower_trimmed(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == s.npos) return "";
  s = s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

constexpr std::pair<TaskKind, std::string_view> kTaskNames[] = {
    {TaskKind::NiahSingle, "niah_single"},         {TaskKind::NiahMultiKey, "niah_multikey"},
    {TaskKind::NiahMultiValue, "niah_multivalue"}, {TaskKind::NiahMultiQuery, "niah_multiquery"},
    {TaskKind::VariableTracking, "vt"},            {TaskKind::CommonWords, "cwe"},
    {TaskKind::Qa, "qa"},
};

}  // namespace

std::string task_name(TaskKind task) {
  for (const auto& [kind, name] : kTaskNames)
    if (kind == task) return std::string(name);
  throw Error(fmt::format("internal error: task kind {} has no name", static_cast<int>(task)));
}

TaskKind parse_task(const std::string& name) {
  std::string valid;
  for (const auto& [kind, n] : kTaskNames) {
    if (n == name) return kind;
    valid += (valid.empty() ? "" : ", ") + std::string(n);
  }
  throw Error(fmt::format("unknown task '{}' (valid tasks: {})", name, valid));
}

std::vector<TaskKind> all_tasks() {
  std::vector<TaskKind> out;
  for (const auto& [kind, name] : kTaskNames) out.push_back(kind);
  return out;
}

Sample make_sample(TaskKind task, int64_t target_tokens, uint64_t seed,
                   const std::function<int64_t(const std::string&)>& token_count) {
  DHS_CHECK(target_tokens > 0, "{}: target_tokens must be positive, got {}", task_name(task), target_tokens);
  DHS_CHECK(static_cast<bool>(token_count), "{}: no token counter given", task_name(task));
  Sample s{task, target_tokens, seed, {}, {}, {}, {}, 0};
  if (task == TaskKind::CommonWords) {
    WordList list(seed);
    s.question = "Which five words appear most often in the list above? Reply with just those five words.";
    s.answer_prefix = "The five words that appear most often in the list are:";
    const int64_t u = fit_count([&](int64_t k) { return token_count(list.render(k) + s.question); },
                                target_tokens, kTokensPerCweWord, task_name(task));
    s.context = list.render(u);
    s.answers = list.common();
  } else {
    // Facts draw from their own stream, so the filler (drawn per sentence) is unaffected.
    Rng rng(mix(mix(seed, kSaltFacts), static_cast<uint64_t>(task)));
    Spec spec = task == TaskKind::VariableTracking ? vt_spec(rng) : task == TaskKind::Qa ? qa_spec(rng)
                                                                                         : niah_spec(task, rng);
    Haystack hay(seed, std::move(spec.header), std::move(spec.facts));
    s.question = std::move(spec.question);
    s.answer_prefix = std::move(spec.answer_prefix);
    s.answers = std::move(spec.answers);
    const int64_t n = fit_count([&](int64_t k) { return token_count(hay.render(k) + s.question); },
                                target_tokens, kTokensPerSentence, task_name(task));
    s.context = hay.render(n);
  }
  s.max_new_tokens = static_cast<int>(token_count(join(s.answers, ", "))) + kAnswerSlack;
  return s;
}

double score_output(const Sample& s, const std::string& output) {
  DHS_CHECK(!s.answers.empty(), "{}: sample has no answers to score", task_name(s.task));
  const std::string out = lower_trimmed(output);
  size_t found = 0;
  for (const std::string& a : s.answers) found += out.find(lower_trimmed(a)) != std::string::npos;
  return static_cast<double>(found) / static_cast<double>(s.answers.size());
}

}  // namespace dhs::eval
