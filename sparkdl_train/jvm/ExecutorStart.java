// Spark plugin of sparkdl_train: every executor starts its Python worker daemon's imports as it starts
// (python -m sparkdl_train.worker.zygote). Built by sparkdl_train.jvm; what it does and why: that module's
// and sparkdl_train/worker/zygote.py's docstrings. Only Spark's public plugin API and java.lang are used.
package org.sparkdl_train;

import java.io.File;
import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;
import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.apache.spark.api.plugin.SparkPlugin;

import scala.Tuple2;

public final class ExecutorStart implements SparkPlugin {
    static final String SETTING = "spark.sparkdl_train.executorStart";
    static final String MODULE = "sparkdl_train.worker.zygote";
    static final String DAEMON = "sparkdl_train.worker.daemon";

    @Override
    public DriverPlugin driverPlugin() {
        return new Driver();
    }

    @Override
    public ExecutorPlugin executorPlugin() {
        return new Executor();
    }

    /** What the driver's Python gives its tasks and the executors cannot know: its interpreter, hash seed and Keras backend. */
    static final class Driver implements DriverPlugin {
        @Override
        public Map<String, String> init(SparkContext sc, PluginContext ctx) {
            Map<String, String> out = new HashMap<>();
            // the executors' interpreter: spark-submit's PythonRunner gives the Python driver spark.pyspark.python as
            // $PYSPARK_PYTHON, and pyspark runs $PYSPARK_PYTHON or python3 (a Python that launched this JVM itself
            // passed its environment on); its tasks' environment["PYTHONHASHSEED"] is $PYTHONHASHSEED or 0
            String python = sc.getConf().get("spark.pyspark.python", null);
            out.put("python", orElse(python, orElse(System.getenv("PYSPARK_PYTHON"), "python3")));
            out.put("PYTHONHASHSEED", orElse(System.getenv("PYTHONHASHSEED"), "0"));
            // the Keras backend a fit gives its stages is the driver's (sparkdl_train.driver.backend_env): where the
            // driver's environment names one, the executors' imports are that backend's
            String keras = System.getenv("KERAS_BACKEND");
            if (keras != null && !keras.isEmpty()) {
                out.put("KERAS_BACKEND", keras);
            }
            return out;
        }
    }

    static final class Executor implements ExecutorPlugin {
        private Process process;

        @Override
        public void init(PluginContext ctx, Map<String, String> extraConf) {
            SparkConf conf = ctx.conf();
            if (!conf.getBoolean(SETTING, true)) {
                return;
            }
            // only sparkdl_train's worker daemon takes a zygote over: for any other, its imports would be wasted
            String daemon = conf.get("spark.python.daemon.module", "pyspark.daemon");
            if (!daemon.equals(DAEMON) || !conf.getBoolean("spark.python.use.daemon", true)) {
                System.err.println("sparkdl_train: spark.python.daemon.module is " + daemon + ", not " + DAEMON
                        + ": no Python imports started with this executor");
                return;
            }
            String python = orElse(extraConf.get("python"), "python3");
            ProcessBuilder pb = new ProcessBuilder(python, "-m", MODULE);
            Map<String, String> env = pb.environment();
            // a daemon's environment as Spark's PythonWorkerFactory makes it: the executor's, the
            // application's spark.executorEnv.*, the driver's hash seed and Spark's Python path first
            String userPath = null;
            for (Tuple2<String, String> kv : conf.getAllWithPrefix("spark.executorEnv.")) {
                if (kv._1().equals("PYTHONPATH")) {
                    userPath = kv._2();
                } else {
                    env.put(kv._1(), kv._2());
                }
            }
            env.put("PYTHONHASHSEED", orElse(extraConf.get("PYTHONHASHSEED"), "0"));
            if (!conf.contains("spark.executorEnv.KERAS_BACKEND") && extraConf.containsKey("KERAS_BACKEND")) {
                env.put("KERAS_BACKEND", extraConf.get("KERAS_BACKEND"));
            }
            if (!conf.contains("spark.executorEnv.OMP_NUM_THREADS")) {
                // Spark's Python runners give their workers OpenMP threads for a task's cores
                env.put("OMP_NUM_THREADS", conf.get("spark.task.cpus", "1"));
            }
            env.put("PYTHONPATH", pythonPath(userPath, System.getenv("PYTHONPATH")));
            env.put("PYTHONUNBUFFERED", "YES");
            env.put("SPARKDL_TRAIN_ZYGOTE_OWNER", Long.toString(ProcessHandle.current().pid()));
            pb.redirectOutput(ProcessBuilder.Redirect.INHERIT);
            pb.redirectError(ProcessBuilder.Redirect.INHERIT);
            try {
                process = pb.start();  // its stdin stays a pipe from here: closed, the zygote ends
            } catch (IOException e) {
                System.err.println("sparkdl_train: could not start " + python + " -m " + MODULE + " (" + e
                        + "); this executor's Python daemons start as usual");
            }
        }

        @Override
        public void shutdown() {
            Process p = process;
            if (p == null) {
                return;
            }
            try {
                p.getOutputStream().close();
                if (!p.waitFor(2, TimeUnit.SECONDS)) {
                    p.destroy();
                    if (!p.waitFor(2, TimeUnit.SECONDS)) {
                        p.destroyForcibly();
                    }
                }
            } catch (IOException | InterruptedException e) {
                p.destroyForcibly();
            }
        }
    }

    /** Spark's pyspark.zip and py4j's zip (as PythonUtils.sparkPythonPath finds them), then the application's and the executor's paths. */
    static String pythonPath(String userPath, String envPath) {
        List<String> parts = new ArrayList<>();
        String home = System.getenv("SPARK_HOME");
        if (home != null) {
            File lib = new File(new File(home, "python"), "lib");
            parts.add(new File(lib, "pyspark.zip").getPath());
            File[] zips = lib.listFiles((d, name) -> name.startsWith("py4j-") && name.endsWith("-src.zip"));
            if (zips != null) {
                for (File z : zips) {
                    parts.add(z.getPath());
                }
            }
        }
        for (String p : new String[] {userPath, envPath}) {
            if (p != null && !p.isEmpty()) {
                parts.add(p);
            }
        }
        return String.join(File.pathSeparator, parts);
    }

    static String orElse(String v, String fallback) {
        return v == null || v.isEmpty() ? fallback : v;
    }
}
