// roam real-program suite: a C++ program on nlohmann/json and the C++
// standard library (libc++). The library is JSON for Modern C++ 3.11.2
// (unmodified, header only); this driver is ours. It builds an order book
// of synthetic records in STL containers, serializes it to JSON text, parses
// it back, and runs queries over the parsed document with STL algorithms
// (sort, maps, sets, a priority-queue shortest-path search).
// Usage: json_stl N   (N >= 1 scales the work). Deterministic: fixed seed.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <numeric>
#include <queue>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

using nlohmann::json;

namespace {

struct Rng {
    uint64_t s;
    uint64_t next() {  // SplitMix64
        uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }
    uint32_t below(uint32_t n) { return (uint32_t)(next() % n); }
};

uint64_t fnv = 0xcbf29ce484222325ULL;
void mix(uint64_t x) {
    for (int i = 0; i < 8; i++) {
        fnv ^= (x >> (8 * i)) & 0xff;
        fnv *= 0x100000001b3ULL;
    }
}
void mix(const std::string &s) {
    for (unsigned char c : s) {
        fnv ^= c;
        fnv *= 0x100000001b3ULL;
    }
}

const char *const kSymbols[] = {"ACME", "BOLT", "CRUX", "DYNA", "ECHO", "FLUX", "GRID", "HALO"};

json make_book(Rng &rng, int n) {
    json orders = json::array();
    for (int i = 0; i < n; i++) {
        json o;
        o["id"] = i;
        o["symbol"] = kSymbols[rng.below(8)];
        o["side"] = rng.below(2) ? "buy" : "sell";
        o["qty"] = 1 + rng.below(500);
        o["price"] = (double)(1000 + rng.below(9000)) / 8.0;  // exact in binary
        o["tags"] = json::array({"t" + std::to_string(rng.below(16)), "t" + std::to_string(rng.below(16))});
        orders.push_back(std::move(o));
    }
    return json{{"venue", "synthetic"}, {"orders", std::move(orders)}};
}

uint64_t queries(const json &book) {
    // Volume per symbol and side (std::map keeps the order deterministic).
    std::map<std::string, std::map<std::string, long>> volume;
    std::unordered_map<std::string, int> tag_count;
    std::set<std::string> tags;
    std::vector<std::pair<double, int>> by_price;
    for (const auto &o : book["orders"]) {
        volume[o["symbol"].get<std::string>()][o["side"].get<std::string>()] += o["qty"].get<long>();
        for (const auto &t : o["tags"]) {
            auto s = t.get<std::string>();
            tag_count[s]++;
            tags.insert(s);
        }
        by_price.emplace_back(o["price"].get<double>(), o["id"].get<int>());
    }
    uint64_t h = 0;
    for (const auto &[sym, sides] : volume)
        for (const auto &[side, v] : sides) h = h * 131 + (uint64_t)v + sym.size() + side.size();
    for (const auto &t : tags) h = h * 131 + (uint64_t)tag_count[t];
    std::stable_sort(by_price.begin(), by_price.end(),
                     [](const auto &a, const auto &b) { return a.first > b.first; });
    for (size_t i = 0; i < by_price.size(); i += 53) h = h * 131 + (uint64_t)by_price[i].second;
    double notional = std::accumulate(book["orders"].begin(), book["orders"].end(), 0.0,
                                      [](double acc, const json &o) {
                                          return acc + o["qty"].get<double>() * o["price"].get<double>();
                                      });
    h = h * 131 + (uint64_t)notional;
    return h;
}

// Dijkstra over a random graph stored in vectors, with std::priority_queue.
uint64_t shortest_paths(Rng &rng, int nodes) {
    std::vector<std::vector<std::pair<int, int>>> adj(nodes);
    for (int i = 0; i < nodes * 6; i++) adj[rng.below(nodes)].emplace_back(rng.below(nodes), 1 + rng.below(100));
    for (int i = 0; i + 1 < nodes; i++) adj[i].emplace_back(i + 1, 1000);
    std::vector<int> dist(nodes, 1 << 30);
    using Item = std::pair<int, int>;
    std::priority_queue<Item, std::vector<Item>, std::greater<Item>> pq;
    dist[0] = 0;
    pq.emplace(0, 0);
    while (!pq.empty()) {
        auto [d, u] = pq.top();
        pq.pop();
        if (d != dist[u]) continue;
        for (auto [v, w] : adj[u])
            if (d + w < dist[v]) {
                dist[v] = d + w;
                pq.emplace(dist[v], v);
            }
    }
    return std::accumulate(dist.begin(), dist.end(), (uint64_t)0);
}

}  // namespace

int main(int argc, char **argv) {
    int n = argc > 1 ? std::atoi(argv[1]) : 1;
    if (n < 1) {
        std::fprintf(stderr, "usage: json_stl N   (N >= 1 scales the work)\n");
        return 2;
    }
    Rng rng{42};
    size_t text_bytes = 0;
    uint64_t q = 0, sp = 0;
    for (int r = 0; r < n; r++) {
        json book = make_book(rng, 2000);
        std::string text = book.dump();
        text_bytes += text.size();
        json back = json::parse(text, nullptr, /*allow_exceptions=*/false);
        if (back.is_discarded() || back != book) {
            std::fprintf(stderr, "VERIFICATION FAILED: JSON round trip differs in round %d\n", r);
            return 1;
        }
        mix(text);
        q = queries(back);
        mix(q);
        std::string pretty = back["orders"][r % 2000].dump(2);
        mix(pretty);
        sp = shortest_paths(rng, 4000);
        mix(sp);
    }
    std::printf("rounds    %d\n", n);
    std::printf("json      %zu bytes\n", text_bytes);
    std::printf("queries   %llu\n", (unsigned long long)q);
    std::printf("paths     %llu\n", (unsigned long long)sp);
    std::printf("checksum  %016llx\n", (unsigned long long)fnv);
    return 0;
}
