-- wrk script: POST /auth/login with a correct password (each request runs one
-- Argon2 verification). The logins go round-robin over BENCH_USERS accounts
-- benchuser0…benchuserN-1 (registered by bench-rounds.sh), so that no username
-- has more attempts in flight than the login throttle allows (5): with one
-- shared user most concurrent logins would be answered 429 without hashing.
local users = tonumber(os.getenv("BENCH_USERS") or "8")
local next_user = 0

request = function()
  local i = next_user
  next_user = (next_user + 1) % users
  return wrk.format("POST", "/auth/login", { ["Content-Type"] = "application/json" },
    '{"username":"benchuser' .. i .. '","password":"benchmark-password"}')
end
