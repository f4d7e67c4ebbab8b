# The product page's sandbox test, run by `make demo` inside the microVM.
cat > primes.py <<'PY'
#!/usr/bin/env python3
primes = []
n = 2
while len(primes) < 15:
    if all(n % p for p in primes if p * p <= n):
        primes.append(n)
    n += 1
print(*primes)
PY
echo "1) primes:"; python3 primes.py
echo "2) whoami: $(whoami); pwd: $(pwd)"
echo "3) network:"; command -v curl && curl -sS -m 8 https://example.com
echo "4) proof:"; printf 'sandbox proof\n' > /tmp/proof.txt && ls -l /tmp/proof.txt
