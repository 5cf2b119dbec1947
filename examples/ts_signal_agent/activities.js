// The calculator tool's activity: evaluates + - * / and parentheses with a small parser (never eval).
// It never throws: a bad expression gets an error message, which the model reads as the tool's result.
'use strict';

/** @param {unknown} expression */
async function calculate(expression) {
  try {
    if (typeof expression !== 'string' || expression.length > 1000) throw new Error('not an expression');
    const value = evaluate(expression);
    return Number.isFinite(value) ? String(value) : 'error: the result is not a finite number';
  } catch (err) {
    return `error: ${err.message}`;
  }
}

function evaluate(source) {
  const tokens = source.match(/\d+(?:\.\d+)?(?:e[+-]?\d+)?|[-+*/()]|\S/gi) ?? [];
  let i = 0;
  const peek = () => tokens[i];
  const take = (t) => (peek() === t ? (i++, true) : false);
  const sum = () => {
    let v = product();
    for (;;) if (take('+')) v += product(); else if (take('-')) v -= product(); else return v;
  };
  const product = () => {
    let v = unary();
    for (;;) if (take('*')) v *= unary(); else if (take('/')) v /= unary(); else return v;
  };
  const unary = () => (take('-') ? -unary() : take('+') ? unary() : atom());
  const atom = () => {
    if (take('(')) {
      const v = sum();
      if (!take(')')) throw new Error('missing )');
      return v;
    }
    const t = tokens[i++];
    if (t === undefined || !/^\d/.test(t)) throw new Error(t === undefined ? 'unexpected end' : `unexpected "${t}"`);
    return Number(t);
  };
  const value = sum();
  if (i < tokens.length) throw new Error(`unexpected "${peek()}"`);
  return value;
}

module.exports = { calculate };
