--[[
gpuwarden admission for Slurm (job_submit/lua, Slurm 22.05): refuse a job that breaches a
gpuwarden `limit` policy, with the policy's message.

Install (docs/admission.md):
  1. slurm.conf:  JobSubmitPlugins=lua
  2. this file as job_submit.lua next to slurm.conf, and job_submit_gpuwarden.lua beside it:
       return {
         command = {"/opt/gpuwarden/bin/gpuwarden"},   -- argv of the gpuwarden CLI
         url = "https://collector.example:4318",
         token_file = "/etc/slurm/gpuwarden-admission.token",  -- an `admission` token
         ca_file = "/etc/slurm/gpuwarden-ca.pem",      -- optional
         timeout_seconds = 5,
         fail_open = true,   -- no verdict (collector down): let the job in (false: refuse it)
       }
  3. scontrol reconfigure

The job's fields never reach a shell: they are written as JSON to a private temporary file
(os.tmpname: mkstemp) that `gpuwarden policies admit` reads on stdin. The command line holds
only the operator's settings above and that file's name, each single-quoted.
]]

local SETTINGS_FILE = "job_submit_gpuwarden.lua"
local FIELDS = {"account", "partition", "name", "comment", "tres_per_job", "tres_per_node",
                "tres_per_task", "min_nodes", "num_tasks", "user_name"}

local function here()
   local source = debug.getinfo(1, "S").source
   return (source:sub(1, 1) == "@" and source:sub(2):match("^(.*)/[^/]*$")) or "."
end

local function load_settings()
   local ok, settings = pcall(dofile, here() .. "/" .. SETTINGS_FILE)
   if not ok or type(settings) ~= "table" then
      return nil, "cannot load " .. SETTINGS_FILE .. ": " .. tostring(settings)
   end
   return settings
end

-- A single-quoted shell word: the operator's settings only, never the job's data.
local function quote(text)
   return "'" .. tostring(text):gsub("'", "'\\''") .. "'"
end

local function json_string(text)
   local escaped = text:gsub('[%c"\\]', function(c)
      return string.format("\\u%04x", c:byte())
   end)
   return '"' .. escaped .. '"'
end

local function job_json(job_desc, cluster)
   local parts = {}
   for _, field in ipairs(FIELDS) do
      local value = job_desc[field]
      local key = field == "user_name" and "user" or field
      if type(value) == "string" then
         table.insert(parts, json_string(key) .. ":" .. json_string(value))
      elseif type(value) == "number" then
         table.insert(parts, json_string(key) .. ":" .. string.format("%d", value))
      end
   end
   if cluster then
      table.insert(parts, json_string("cluster") .. ":" .. json_string(cluster))
   end
   return "{" .. table.concat(parts, ",") .. "}"
end

-- "ALLOW ...", "DENY ..." or "ERROR ..." from `gpuwarden policies admit`.
local function ask(settings, body)
   local path = os.tmpname()
   local file = io.open(path, "w")
   if not file then
      return "ERROR", "cannot write " .. path
   end
   file:write(body)
   file:close()
   local words = {}
   for _, word in ipairs(settings.command) do
      table.insert(words, quote(word))
   end
   local command = table.concat(words, " ") .. " policies admit --url " .. quote(settings.url)
      .. " --token-file " .. quote(settings.token_file)
      .. " --timeout " .. quote(settings.timeout_seconds or 5)
   if settings.ca_file then
      command = command .. " --ca-file " .. quote(settings.ca_file)
   end
   local pipe = io.popen(command .. " < " .. quote(path) .. " 2>&1")
   local output = pipe and pipe:read("*a") or ""
   if pipe then pipe:close() end
   os.remove(path)
   local word, message = output:match("^(%u+) ?([^\n]*)")
   if word == "ALLOW" or word == "DENY" or word == "ERROR" then
      return word, message
   end
   return "ERROR", "unexpected output: " .. output:sub(1, 200)
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   local settings, problem = load_settings()
   if not settings then
      slurm.log_error("gpuwarden admission: %s", problem)
      return slurm.SUCCESS
   end
   local word, message = ask(settings, job_json(job_desc, settings.cluster))
   if word == "DENY" then
      slurm.log_info("gpuwarden admission: denied uid %d: %s", submit_uid, message)
      slurm.log_user("%s", message)
      return slurm.ERROR
   end
   if word == "ERROR" then
      slurm.log_error("gpuwarden admission: no verdict: %s", message)
      if settings.fail_open == false then
         slurm.log_user("gpuwarden admission is unavailable; try again later")
         return slurm.ERROR
      end
   end
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurm.SUCCESS
end

return slurm.SUCCESS
