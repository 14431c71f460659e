-- wrk script: POST /auth/login with a correct password (each request runs one Argon2 verification).
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"username":"benchuser","password":"benchmark-password"}'
