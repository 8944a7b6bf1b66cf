wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"inputs": [{"sepal_length_cm": 5.1, "sepal_width_cm": 3.5, "petal_length_cm": 1.4, "petal_width_cm": 0.2}]}'
response = function(status, headers, body)
  if status ~= 200 then io.write("status " .. status .. "\n") end
end
