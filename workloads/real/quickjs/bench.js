// roam real-program suite: a JavaScript benchmark run by QuickJS through our
// driver (quickjs/driver.c). `N` (a global set by the driver from argv[1])
// scales the work linearly. Deterministic: its own PRNG, no Date, no
// Math.random. Prints one line per kernel and a final checksum.
var checksum = 0;
function mix(x) { checksum = (Math.imul(checksum, 31) + (x | 0)) >>> 0; }

var seed = 42;
function rand() { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return seed >>> 8; }

// 1. recursion
function fib(n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
var f = 0;
for (var r = 0; r < N; r++) f += fib(20);
print("fib      " + f); mix(f);

// 2. classes and method calls (Richards-style dispatch through objects)
class Shape { area() { return 0; } }
class Rect extends Shape { constructor(w, h) { super(); this.w = w; this.h = h; } area() { return this.w * this.h; } }
class Tri extends Shape { constructor(b, h) { super(); this.b = b; this.h = h; } area() { return (this.b * this.h) >> 1; } }
class Sq extends Rect { constructor(s) { super(s, s); } }
var area = 0;
for (var r = 0; r < N; r++) {
  var shapes = [];
  for (var i = 0; i < 3000; i++) {
    var k = rand() % 3;
    shapes.push(k == 0 ? new Rect(i % 13, i % 7) : k == 1 ? new Tri(i % 11, i % 5) : new Sq(i % 9));
  }
  for (var s of shapes) area = (area + s.area()) % 1000000007;
}
print("classes  " + area); mix(area);

// 3. arrays: sort with a comparator, map/filter/reduce
var sorted = 0;
for (var r = 0; r < N; r++) {
  var a = [];
  for (var i = 0; i < 5000; i++) a.push(rand() % 100000);
  a.sort(function (x, y) { return y - x; });
  sorted = (sorted + a.filter(function (x) { return x % 3 == 0; })
                      .map(function (x, i) { return x * (i % 7); })
                      .reduce(function (s, x) { return (s + x) % 1000000007; }, 0)) % 1000000007;
}
print("arrays   " + sorted); mix(sorted);

// 4. strings and regular expressions
var strs = 0;
for (var r = 0; r < N; r++) {
  var parts = [];
  for (var i = 0; i < 2000; i++) parts.push("w" + (i * (r + 1)) + "_" + (i * 7919).toString(16));
  var s = parts.join(" ");
  var m = s.match(/w(\d+)_/g);
  strs += m.length;
  s = s.replace(/_([0-9a-f]+)/g, function (_, h) { return "-" + h.length; });
  strs = (strs + s.length + s.split("-").length) % 1000000007;
}
print("strings  " + strs); mix(strs);

// 5. Map and Set
var maps = 0;
for (var r = 0; r < N; r++) {
  var m = new Map(), st = new Set();
  for (var i = 0; i < 10000; i++) {
    var key = "k" + (rand() % 2000);
    m.set(key, (m.get(key) || 0) + i);
    st.add(rand() % 5000);
  }
  var keys = Array.from(m.keys()).sort();
  for (var j = 0; j < keys.length; j += 37) maps = (maps + m.get(keys[j])) % 1000000007;
  maps = (maps + st.size) % 1000000007;
}
print("maps     " + maps); mix(maps);

// 6. JSON round trip
var js = 0;
for (var r = 0; r < N; r++) {
  var doc = [];
  for (var i = 0; i < 500; i++) doc.push({ id: i, name: "item" + i, tags: ["a" + (i % 5), "b" + (i % 3)], score: (i * 37) % 101 });
  var text = JSON.stringify(doc);
  var back = JSON.parse(text);
  for (var i = 0; i < back.length; i++) js = (js + back[i].score * back[i].tags[0].length) % 1000000007;
  js = (js + text.length) % 1000000007;
}
print("json     " + js); mix(js);

// 7. closures and floating point (IEEE-exact operations only)
function makeAcc() { var sum = 0; return function (x) { sum += x; return sum; }; }
var acc = makeAcc(), x = 0.5, fl = 0;
for (var i = 1; i <= 50000 * N; i++) { x = 3.7 * x * (1 - x); fl = acc(x / i); }
print("float    " + fl.toFixed(9)); mix(Math.floor(fl * 1e6));

print("checksum " + ("00000000" + checksum.toString(16)).slice(-8));
