// The flash-crowd scenario for k6, against a running seckill service.
//
//   loadtest tokens --url $BASE_URL --admin-token $ADMIN_TOKEN --users 10000 --out tokens.json
//   k6 run -e BASE_URL=$BASE_URL -e ADMIN_TOKEN=$ADMIN_TOKEN -e TOKENS=tokens.json flash.js
//
// Options (-e NAME=value): STOCK (100), PER_USER (3), VUS (1000).
// The run fails (non-zero exit) on any 5xx, on any answer outside the
// contract, and on any broken invariant, checked in teardown through the
// admin API.
import http from 'k6/http';
import exec from 'k6/execution';
import { check, sleep } from 'k6';
import { Counter } from 'k6/metrics';
import { SharedArray } from 'k6/data';

const BASE_URL = __ENV.BASE_URL || 'http://127.0.0.1:8080';
const ADMIN = { headers: { Authorization: `Bearer ${__ENV.ADMIN_TOKEN}`, 'Content-Type': 'application/json' } };
const STOCK = parseInt(__ENV.STOCK || '100', 10);
const PER_USER = parseInt(__ENV.PER_USER || '3', 10);
const VUS = parseInt(__ENV.VUS || '1000', 10);

// Loaded once, shared read-only by every VU.
const tokens = new SharedArray('tokens', () => JSON.parse(open(__ENV.TOKENS || 'tokens.json')));

const orders = new Counter('orders');
const serverErrors = new Counter('server_errors');
const unexpected = new Counter('unexpected_answers');
const invariantBreaches = new Counter('invariant_breaches');

// What a purchase may answer under a crowd (status, error code).
const ALLOWED = {
  409: ['sold_out', 'already_purchased'],
  429: ['purchase_in_progress'],
};

export const options = {
  scenarios: {
    flash: {
      executor: 'shared-iterations',
      vus: VUS,
      iterations: tokens.length * PER_USER,
      maxDuration: '10m',
    },
  },
  thresholds: {
    server_errors: ['count==0'],
    unexpected_answers: ['count==0'],
    invariant_breaches: ['count==0'],
  },
  // Latency is reported, not judged: speed belongs in benchmarks.
  summaryTrendStats: ['avg', 'p(50)', 'p(99)', 'max'],
};

export function setup() {
  const now = Date.now();
  const body = JSON.stringify({
    title: 'k6 flash',
    stock: STOCK,
    begin_time: new Date(now - 60_000).toISOString(),
    end_time: new Date(now + 3_600_000).toISOString(),
  });
  const res = http.post(`${BASE_URL}/admin/vouchers`, body, ADMIN);
  if (res.status !== 201) {
    throw new Error(`creating the voucher failed: ${res.status} ${res.body}`);
  }
  return { voucher: res.json('id') };
}

export default function (data) {
  // Each user's requests are spread over the run: iteration i is user
  // i mod N, so the same user comes back every N iterations.
  const i = exec.scenario.iterationInTest;
  const user = tokens[i % tokens.length];
  const res = http.post(`${BASE_URL}/seckill/${data.voucher}`, null, {
    headers: { Authorization: `Bearer ${user.token}` },
    tags: { name: 'purchase' },
  });
  if (res.status >= 500) {
    serverErrors.add(1);
  }
  if (res.status === 200) {
    orders.add(1);
    check(res, { 'order id is a decimal string': (r) => /^[1-9][0-9]*$/.test(r.json('order_id')) });
    return;
  }
  let code = null;
  try {
    code = res.json('error');
  } catch (_) {
    // not JSON: counted below
  }
  const ok = (ALLOWED[res.status] || []).includes(code);
  if (!ok) {
    unexpected.add(1);
  }
  check(res, { 'answer is in the contract': () => ok });
}

// An admin read after the crowd: a 503 is the instance still shedding
// (its admin routes come back within a second or two of the load), so it
// is asked again as its Retry-After says, for up to 30 s.
function adminGet(path) {
  let res;
  for (let tries = 0; tries < 30; tries++) {
    res = http.get(`${BASE_URL}${path}`, ADMIN);
    if (res.status !== 503) break;
    sleep(Number(res.headers['Retry-After']) || 1);
  }
  return res;
}

export function teardown(data) {
  const stats = adminGet(`/admin/vouchers/${data.voucher}/stats`).json();
  const expected = Math.min(STOCK, tokens.length);
  const problems = [];
  if (stats.orders + stats.stock !== stats.initial_stock) problems.push('orders + stock != initial stock');
  if (stats.stock < 0) problems.push('stock below zero');
  if (stats.distinct_users !== stats.orders) problems.push('a user holds two orders');
  if (stats.orders !== expected) problems.push(`expected ${expected} orders, found ${stats.orders}`);
  const listed = adminGet(`/admin/vouchers/${data.voucher}/orders`).json('orders');
  if (new Set(listed.map((o) => o.order_id)).size !== listed.length) problems.push('order ids repeat');
  console.log(`voucher ${data.voucher}: ${JSON.stringify(stats)}`);
  if (problems.length > 0) {
    invariantBreaches.add(problems.length);
    throw new Error(`invariants broken: ${problems.join('; ')}`);
  }
}
